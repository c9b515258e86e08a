"""A stand-in for a training script, so the quickstart's jobs really run on the sim.

    python3 bin/train.py STEPS [SECONDS_PER_STEP]

It prints progress, writes a checkpoint after every step into $FLEETOPS_CHECKPOINT_DIR (when the
Job has `checkpoint`), resumes from it when started again (after a spot interruption, on the
replacement instance), and on the checkpoint signal saves and exits at once."""

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

step = 0
if ckpt and os.path.exists(ckpt):
    with open(ckpt) as f:
        step = json.load(f)["step"]
    print(f"{job} rank {rank}: resuming from checkpoint {ckpt} at step {step}", flush=True)


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
