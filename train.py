"""Train, validate and evaluate: `python train.py [group=option ...] [key=value ...]` (see README)."""
from mcseg.cli import train_main

if __name__ == "__main__":
    train_main()
