#!/usr/bin/env python3
"""A local multiple-choice task from held-out text, for lm-evaluation-harness (issue 32):
each item is 16 words of context and 4 choices of 4 words, the true continuation and three
from elsewhere in the text, shuffled (seeded).

Usage: lm_eval_task.py TEXT OUT.jsonl N
"""
import json, random, re, sys
text = open(sys.argv[1]).read()
words = re.sub(r"\s+", " ", text).split(" ")
words = [w for w in words if w]
rnd = random.Random(0)
# Skip the title page; items from the body.
body = words[200:]
items = []
for _ in range(int(sys.argv[3])):
    i = rnd.randrange(0, len(body) - 40)
    ctx = " ".join(body[i:i + 16])
    gold = " " + " ".join(body[i + 16:i + 20])
    choices = [gold]
    while len(choices) < 4:
        j = rnd.randrange(0, len(body) - 10)
        if abs(j - i) < 40:
            continue
        choices.append(" " + " ".join(body[j:j + 4]))
    order = list(range(4)); rnd.shuffle(order)
    items.append({"context": ctx, "choices": [choices[k] for k in order], "label": order.index(0)})
with open(sys.argv[2], "w") as f:
    for it in items:
        f.write(json.dumps(it) + "\n")
