"""A stand-in for a training script, so the quickstart's jobs really run on the sim.

    python3 bin/train.py STEPS [SECONDS_PER_STEP]

It prints progress, writes a checkpoint after every step into $FLEETOPS_CHECKPOINT_DIR (when the
Job has `checkpoint`), resumes from it when started again (after a spot interruption, on the
replacement instance), and on the checkpoint signal saves and exits at once.

A gang's ranks (WORLD_SIZE > 1) step on their own here (no collective), so at one stop they hold
different steps; each resumes from the lowest step any rank's checkpoint holds, which every rank
computes alike: fleetops gives every instance of the gang the same round, all ranks' files
(reconciler/runtime/checkpoints.py). A real DDP job agrees on its stop step over its ranks instead."""

import json
import os
import signal
import sys
import time

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 60
delay = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
job, rank, world = os.environ.get("FLEETOPS_JOB", "job"), os.environ.get("RANK", "0"), os.environ.get("WORLD_SIZE", "1")
ckdir = os.environ.get("FLEETOPS_CHECKPOINT_DIR")
ckpt = os.path.join(ckdir, f"rank-{rank}.json") if ckdir else None
stop = []
for name in ("SIGTERM", "SIGUSR1", "SIGINT"):
    signal.signal(getattr(signal, name), lambda sig, frame: stop.append(sig))


def saved(path):
    """The step a rank's checkpoint holds, None without one."""
    try:
        with open(path) as f:
            return json.load(f)["step"]
    except FileNotFoundError:
        return None


step = 0
if ckpt and os.path.exists(ckpt):
    # (measured on the sim before: applied 3 s after a notice, rank 0 resumed at step 19 and the moved rank 1 at 7)
    held = {r: saved(os.path.join(ckdir, f"rank-{r}.json")) or 0 for r in range(int(world))}
    step, own = min(held.values()), saved(ckpt)
    behind = ", ".join(f"rank {r}'s" for r, n in held.items() if n == step)
    print(f"{job} rank {rank}: resuming from checkpoint {ckpt} at step {step}"
          + (f" (the gang's lowest, {behind}; this rank's own is at {own})" if step != own else ""), flush=True)


def save(n: int) -> None:
    if ckpt:
        os.makedirs(ckdir, exist_ok=True)
        with open(ckpt + ".tmp", "w") as f:
            json.dump({"step": n}, f)
        os.replace(ckpt + ".tmp", ckpt)


while step < steps:
    if stop:
        save(step)
        print(f"{job} rank {rank}: signal {stop[0]}: checkpointed at step {step}, exiting", flush=True)
        sys.exit(0)
    time.sleep(delay)
    step += 1
    save(step)
    print(f"{job} rank {rank}/{world}: step {step}/{steps} loss {2.0 / (1 + step / 10):.3f}", flush=True)
print(f"{job} rank {rank}: done after {steps} steps", flush=True)
