"""Re-evaluate a checkpoint: `python evaluate.py ckpt=<run>/checkpoints/best.pt [split=val]` (see README)."""
from mcseg.cli import evaluate_main

if __name__ == "__main__":
    evaluate_main()
