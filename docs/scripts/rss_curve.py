"""Resident memory (and glibc's malloc counters) of a generation from the Python API as it runs: the
embedded model, docs/prompts/clockmaker.txt as raw text, seed 3, EOS ignored, one thread. Session 33 found
with it that the oneDNN attention path grew a run by ~0.5 GiB past 3K context (docs/benchmarks.md).

python docs/scripts/rss_curve.py ar|tokenswift N [--every K] [--trim K] [--pyobj] [--tensors] [--tm] [--out FILE]"""
import argparse, ctypes, gc, json, os, time, tracemalloc

ap = argparse.ArgumentParser()
ap.add_argument("method"); ap.add_argument("n", type=int)
ap.add_argument("--trim", type=int, default=0, help="malloc_trim(0) every this many tokens")
ap.add_argument("--pyobj", action="store_true"); ap.add_argument("--tensors", action="store_true")
ap.add_argument("--tm", action="store_true"); ap.add_argument("--every", type=int, default=100)
ap.add_argument("--out", default=None); ap.add_argument("--mallinfo", action="store_true")
a = ap.parse_args()

def status():
    d = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmHWM", "VmSize"):
                d[k] = int(v.split()[0]) / 1024  # MB (MiB)
    return d

libc = ctypes.CDLL("libc.so.6")
class Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena","ordblks","smblks","hblks","hblkhd","usmblks","fsmblks","uordblks","fordblks","keepcost")]
libc.mallinfo2.restype = Mallinfo2
def mi():
    m = libc.mallinfo2()
    return dict(arena=m.arena/2**20, hblkhd=m.hblkhd/2**20, hblks=m.hblks, uord=m.uordblks/2**20, ford=m.fordblks/2**20, keep=m.keepcost/2**20)

rows = []
def rec(tag, tok, **extra):
    r = dict(tag=tag, tok=tok, t=round(time.time() - T0, 1), **{k: round(v, 1) for k, v in status().items()})
    if a.mallinfo: r.update({k: round(v, 1) for k, v in mi().items()})
    r.update(extra); rows.append(r); print(json.dumps(r), flush=True)

T0 = time.time()
rec("start", 0)
import torch
torch.set_num_threads(1)
rec("import_torch", 0)
import longswift
rec("import_longswift", 0)
e = longswift.load(threads=1)
gc.collect()
rec("loaded", 0)
text = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "prompts", "clockmaker.txt")).read()

def tensors():
    n = b = 0; seen = set()
    for o in gc.get_objects():
        try:
            if isinstance(o, torch.Tensor):
                st = o.untyped_storage(); p = st.data_ptr()
                n += 1
                if p not in seen: seen.add(p); b += st.nbytes()
        except Exception: pass
    return n, b / 2**20

if a.tm: tracemalloc.start(25)
stream = e.stream(text, sampling=longswift.SamplingConfig(seed=3),
                  generation=longswift.GenerationConfig(max_new_tokens=a.n, ignore_eos=True),
                  chat=False, method=a.method)
got = 0; nxt = 0; nxt_trim = a.trim; snaps = {}
first = True
for ids in stream:
    if first:
        rec("first_token", got); first = False
    got += len(ids)
    if got >= nxt:
        extra = {}
        if a.pyobj: gc.collect(); extra["pyobjs"] = len(gc.get_objects())
        if a.tensors: extra["tensors"], extra["tensor_mb"] = tensors()
        rec("gen", got, **extra)
        nxt = (got // a.every + 1) * a.every
    if a.tm and (got >= 1000 and 1000 not in snaps or got >= a.n - 50 and 3000 not in snaps):
        k = 1000 if 1000 not in snaps else 3000
        gc.collect(); snaps[k] = tracemalloc.take_snapshot()
        cur, peak = tracemalloc.get_traced_memory(); rec("tm", got, tm_cur=cur/2**20, tm_peak=peak/2**20)
    if a.trim and got >= nxt_trim:
        before = status()["VmRSS"]; libc.malloc_trim(0); after = status()["VmRSS"]
        print(json.dumps(dict(trim_at=got, before=round(before,1), after=round(after,1))), flush=True)
        rows.append(dict(tag="trim", tok=got, before=before, after=after))
        nxt_trim = (got // a.trim + 1) * a.trim
rec("end", got)
res = stream.result
print(json.dumps(dict(stats=res.stats.to_dict() if hasattr(res.stats, "to_dict") else str(res.stats))), flush=True)
if a.tm and len(snaps) == 2:
    for s in snaps[3000].compare_to(snaps[1000], "lineno")[:15]: print("TM", s)
    for s in snaps[3000].compare_to(snaps[1000], "traceback")[:3]:
        print("TMTB", s); [print("   ", l) for l in s.traceback.format()[-12:]]
if a.out: json.dump(rows, open(a.out, "w"))
