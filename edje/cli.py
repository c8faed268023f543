"""The `edje` command: one subcommand per job, each the same as running its script.

    edje encode --input ... --output ...     is   python jobs/encode_cc12m.py --input ... --output ...
    edje sampleworld generate --seed 7 ...   is   python -m edje.sampleworld generate --seed 7 ...

`edje COMMAND --help` prints that job's own options. The job modules load only when their command runs, so
`edje --help` is quick.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from typing import Dict, Optional, Sequence, Tuple

# subcommand -> (module with main(argv), one line of help)
COMMANDS: Dict[str, Tuple[str, str]] = {
    "encode": ("edje.jobs.encode_cc12m", "url list (or images already held) -> backbone -> adapter -> Parquet token tables (Ray Data)"),
    "compress": ("edje.jobs.compress", "raw token tables -> adapter -> quantized compressed tables, no backbone (Ray Data)"),
    "pretrain": ("edje.jobs.pretrain", "pretrain adapter + joint encoder on raw token tables (Ray Train)"),
    "finetune": ("edje.jobs.finetune", "fine-tune a checkpoint with ITM (Ray Train)"),
    "distill": ("edje.jobs.distill", "distil a local-adapter teacher into a compressed student (Ray Train)"),
    "evaluate": ("edje.jobs.evaluate", "recall before and after reranking, within-family accuracy, comparisons"),
    "serve": ("edje.jobs.serve", "serve the reranker, first stage and miner on Ray Serve"),
    "quickstart": ("edje.jobs.quickstart", "the whole loop on the embedded sample world, on one machine"),
    "sampleworld": ("edje.sampleworld.cli", "generate or serve the embedded sample world"),
    "train-backbone": ("edje.jobs.train_backbone", "train the small stand-in backbone on a sample world"),
    "distill-text-tower": ("edje.jobs.distill_text_tower", "distil a backbone's text tower into a pretrained language "
                           "model's, on captions alone"),
}


def parser() -> argparse.ArgumentParser:
    """The top-level parser: it lists the subcommands; each job parses its own options."""
    p = argparse.ArgumentParser(prog="edje", description="EDJE on Ray: vision-language reranking with stored, "
                                "compressed vision tokens. Run `edje COMMAND --help` for a command's options.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    for name, (_, text) in COMMANDS.items():
        sub.add_parser(name, help=text, add_help=False)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Dispatch ``argv`` (default: the command line) to its job's ``main``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    p = parser()
    if not argv or argv[0] in ("-h", "--help"):
        p.print_help()
        return 0
    if argv[0] not in COMMANDS:
        p.error(f"unknown command {argv[0]!r} (choose from {', '.join(COMMANDS)})")
    module, _ = COMMANDS[argv[0]]
    job = importlib.import_module(module)
    sys.argv[0] = f"edje {argv[0]}"  # argparse names the program after it in the job's usage lines
    rc = job.main(argv[1:])
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
