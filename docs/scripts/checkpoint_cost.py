"""What building a checkpoint file's text costs at 100K generated tokens (Checkpoint.to_json, three times):
run it for two checkouts with PYTHONPATH=CHECKOUT/src. Session 34: 83-87 ms with dataclasses.asdict's deep
copy and two serialisations, 8.4-10.8 ms serialised once.

python docs/scripts/checkpoint_cost.py"""
import random, time
import longswift
from longswift.checkpoint import Checkpoint

rng = random.Random(0)
ids = [rng.randrange(49152) for _ in range(100_000)]
c = Checkpoint("m", "f", {"dtype": "float32"}, None, None, "ar", {"seed": 1}, {"max_new_tokens": 100_000}, {},
               list(range(2000)), ids, None, {"steps": 1})
print(longswift.__file__)
for _ in range(3):
    t = time.perf_counter()
    text = c.to_json()
    print(f"to_json: {1e3 * (time.perf_counter() - t):.1f} ms, {len(text):,} characters")
