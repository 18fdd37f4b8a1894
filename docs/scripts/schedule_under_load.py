"""Adaptive steps on a loaded machine: `longswift bench` (its arguments after `--`) with a load that switches on
and off beside it, and every choice and timing of the schedule logged. A child process multiplies 1536x1536
float32 matrices on THREADS threads for ON seconds, sleeps OFF seconds, and again until the bench ends. Prints
the schedule's lead changes and, per kind of step, the steps, tokens and seconds it recorded. Run from the repo
root, e.g. (session 56):
python docs/scripts/schedule_under_load.py 15 15 1 -- --methods ar,tokenswift --prompt-file
docs/prompts/clockmaker.txt --prefix 2048 --lengths 1024 --presets paper --runs 1 --lockstep --no-progress
--out-dir /tmp/load"""
import collections
import multiprocessing
import sys
import time


def load(on: float, off: float, threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(1536, 1536), torch.randn(1536, 1536)
    while True:
        t = time.time()
        while time.time() - t < on:
            a @ b
        time.sleep(off)


def main() -> int:
    split = sys.argv.index("--")
    on, off, threads = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
    from longswift.cli import main as cli
    from longswift.spec import schedule

    log: list[tuple] = []
    choose, record = schedule.StepSchedule.choose, schedule.StepSchedule.record

    def logged_choose(self):  # noqa: ANN001, ANN202
        before = self.best
        kind = choose(self)
        log.append(("choose", kind, before, self.best))
        return kind

    def logged_record(self, kind, tokens, seconds):  # noqa: ANN001, ANN202
        log.append(("record", kind, tokens, seconds))
        return record(self, kind, tokens, seconds)

    schedule.StepSchedule.choose, schedule.StepSchedule.record = logged_choose, logged_record
    child = multiprocessing.Process(target=load, args=(on, off, threads), daemon=True)
    child.start()
    try:
        rc = cli(["bench", *sys.argv[split + 1:]])
    finally:
        child.terminate()
    leads = [(i, e[2], e[3]) for i, e in enumerate(e for e in log if e[0] == "choose") if e[2] != e[3]]
    print(f"lead changes (step, from, to): {leads}")
    per_kind: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0, 0.0])
    for _, kind, tokens, seconds in (e for e in log if e[0] == "record"):
        per_kind[kind][0] += 1
        per_kind[kind][1] += tokens
        per_kind[kind][2] += seconds or 0.0
    for kind, (steps, tokens, seconds) in per_kind.items():
        print(f"{kind}: {steps} steps, {tokens} tokens, {seconds:.1f} s, {1000 * seconds / steps:.1f} ms a step")
    return rc


if __name__ == "__main__":
    sys.exit(main())
