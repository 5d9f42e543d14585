#!/usr/bin/env python3
"""Runs the shell commands the README and the user guide mark as runnable offline.

A fenced `sh` block preceded by `<!-- check -->` is run as a reader would paste it, with the
built binaries first on PATH (`deltafin`, `deltafin-k3`), in the repository root, under a fresh
empty HOME (so `~/...` paths start empty; cargo and rustup keep their own homes), with no
HF_ENDPOINT or HF_TOKEN. The marker may say `<!-- check: skip="cargo test" stdin="Hello" -->`:
lines containing the skip text are not run (each is printed), and the block reads stdin from the
given text. All marked blocks of one page run in one shell, in order, stopping at the first
failure; background jobs are killed when the page ends. `python3` is a cached virtualenv with
the `openai` package. Exit status 1 names the page, the block's line and the command's output.
Run by scripts/check_docs.sh (from .ci/run) after `cargo build --release`.
"""
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
MARK = re.compile(r"^<!--\s*check(?::(.*?))?\s*-->\s*$")


def blocks(page):
    """(line, options, code) for each marked block of `page`."""
    lines = page.read_text(encoding="utf-8").split("\n")
    out = []
    for i, line in enumerate(lines):
        m = MARK.match(line.strip())
        if not m:
            continue
        opts = dict(w.split("=", 1) for w in shlex.split(m.group(1) or ""))
        j = i + 1
        while j < len(lines) and not lines[j].strip():
            j += 1
        if j >= len(lines) or not re.match(r"^```(sh|bash|console)\s*$", lines[j].strip()):
            sys.exit(f"{page}:{i + 1}: a check marker must precede a ```sh block")
        k = j + 1
        while k < len(lines) and not lines[k].startswith("```"):
            k += 1
        out.append((j + 1, opts, "\n".join(lines[j + 1 : k])))
    return out


def script_for(page, found):
    parts = ["set -euo pipefail", "trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true' EXIT"]
    for line, opts, code in found:
        skip = opts.get("skip")
        kept = []
        for c in code.split("\n"):
            if skip and skip in c:
                parts.append(f"echo {shlex.quote('(not run here: ' + c.strip() + ')')}")
            else:
                kept.append(c)
        parts.append(f"echo {shlex.quote(f'== {page}:{line}')}")
        body = "\n".join(kept)
        if "stdin" in opts:
            text = opts["stdin"].replace("\\n", "\n") + "\n"
            parts.append(f"{{\n{body}\n}} <<'DOC_STDIN'\n{text}DOC_STDIN")
        else:
            parts.append(f"{{\n{body}\n}} < /dev/null")
    return "\n".join(parts) + "\n"


def venv():
    """A cached virtualenv with the openai client (the README's server example uses it)."""
    cache = pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache"))
    env = cache / "deltafin" / "docs-venv"
    if not (env / "bin" / "python3").exists() or subprocess.run(
        [env / "bin" / "python3", "-c", "import openai"], capture_output=True
    ).returncode:
        shutil.rmtree(env, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", env], check=True)
        subprocess.run([env / "bin" / "pip", "install", "--quiet", "openai"], check=True)
    return env


def main():
    pages = [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))
    env_dir = venv()
    home = os.environ.get("HOME", str(pathlib.Path.home()))
    failed = 0
    for page in pages:
        found = blocks(page)
        if not found:
            continue
        rel = page.relative_to(ROOT)
        with tempfile.TemporaryDirectory(prefix="deltafin-doc-") as tmp:
            env = {k: v for k, v in os.environ.items() if k not in ("HF_ENDPOINT", "HF_TOKEN")}
            env["CARGO_HOME"] = os.environ.get("CARGO_HOME", f"{home}/.cargo")
            env["RUSTUP_HOME"] = os.environ.get("RUSTUP_HOME", f"{home}/.rustup")
            env["HOME"] = tmp
            env["PATH"] = f"{ROOT}/target/release:{env_dir}/bin:{os.environ['PATH']}"
            t0 = time.time()
            r = subprocess.run(
                ["bash", "-c", script_for(rel, found)],
                cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
            )
            took = time.time() - t0
        status = "ok" if r.returncode == 0 else f"FAILED (exit {r.returncode})"
        print(f"doc_commands: {rel}: {len(found)} blocks, {took:.0f} s: {status}")
        if r.returncode:
            failed += 1
            print(r.stdout[-4000:])
            print(r.stderr[-4000:])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
