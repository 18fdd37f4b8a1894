"""What the terminal status line costs per token: `longswift generate`'s TerminalDisplay (and the tqdm bar
of PlainDisplay) fed N tokens of real detokenized text (random ids of the embedded model's tokenizer, 1-3 a
step), ms per 1K tokens at some positions. Run it under a terminal, e.g. `script -qc "python
docs/scripts/display_cost.py 20000" /dev/null`, and for another checkout with PYTHONPATH=CHECKOUT/src.
Session 34: redrawn at every step it took ~0.58 ms a token; at most every 50 ms, ~0.07.

python docs/scripts/display_cost.py [N] [--out FILE]"""
import argparse, random, sys, time
import longswift
from longswift.cli.display import PlainDisplay, TerminalDisplay
from longswift.detok import IncrementalDecoder
from longswift.stats import GenerationStats

ap = argparse.ArgumentParser()
ap.add_argument("n", type=int, nargs="?", default=20_000); ap.add_argument("--out", default=None)
a = ap.parse_args()
tok = longswift.load(heads=None, threads=1).tokenizer
rng, dec, pieces, n = random.Random(0), IncrementalDecoder(tok), [], 0
while n < a.n:
    k = rng.randint(1, 3)
    pieces.append((k, dec.push([rng.randrange(17, len(tok)) for _ in range(k)])))
    n += k
lines = []
for name in ("terminal", "tqdm"):
    stats = GenerationStats(method="tokenswift", prompt_tokens=4, steps=1, new_tokens=1)
    disp = TerminalDisplay(a.n, 0) if name == "terminal" else PlainDisplay(sys.stdout.write, a.n, 0, True)
    marks, done, mark, last = [], 0, 1000, time.perf_counter()
    with disp:
        for k, text in pieces:
            disp.text(text)
            stats.steps += 1; stats.new_tokens += k; done += k
            disp.advance(k, stats)
            if done >= mark:
                t = time.perf_counter(); marks.append((done, 1e3 * (t - last))); last = t; mark += 1000
    keep = [m for i, m in enumerate(marks) if i < 2 or (i + 1) % 10 == 0]
    lines.append(f"{name}: ms per 1K tokens at position: " + ", ".join(f"{p}:{ms:.1f}" for p, ms in keep))
out = open(a.out, "w") if a.out else sys.stderr
print(longswift.__file__, *lines, sep="\n", file=out)
