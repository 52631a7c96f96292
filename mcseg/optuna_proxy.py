"""``python -m mcseg.optuna_proxy STORAGE [--host H] [--port P]``: Optuna's gRPC storage proxy over one storage.

Many sweep processes and jobs (``hydra.sweeper.storage=grpc://H:P``) then share one study through this server
instead of each opening the database or journal file (Optuna's ``run_grpc_proxy_server``; it serves until
stopped). ``STORAGE`` is anything ``hydra.sweeper.storage`` takes but a gRPC URL (:func:`mcseg.trials.open_storage`).
"""
from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mcseg.optuna_proxy", description=__doc__.splitlines()[0])
    parser.add_argument("storage", help="journal:PATH or a database URL (what the proxy serves)")
    parser.add_argument("--host", default="localhost", help="address to listen on (0.0.0.0: every interface)")
    parser.add_argument("--port", type=int, default=13000)
    args = parser.parse_args(argv)
    from optuna.storages import run_grpc_proxy_server

    from mcseg.trials import GRPC, open_storage

    if args.storage.startswith(GRPC):
        print(f"error: {args.storage}: the proxy serves a journal or a database, not another proxy", file=sys.stderr)
        return 1
    try:
        storage = open_storage(args.storage)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"serving {args.storage} on grpc://{args.host}:{args.port}", flush=True)
    run_grpc_proxy_server(storage, host=args.host, port=args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
