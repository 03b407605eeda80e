"""``python -m control.workflow_cli``: workflow tasks and Brain pages from the shell (against ``REDIS_URL``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import orjson

from control.client import ControlPlane
from control.workflow import WorkflowClient


def main(argv: list[str] | None = None) -> int:
    """CLI entry point (``python -m control.workflow_cli``)."""
    parser = argparse.ArgumentParser(
        prog="python -m control.workflow_cli", description="Workflow tasks and Brain pages"
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    add = sub.add_parser("brain-add", help="create or replace a Brain page")
    add.add_argument("--agent", default="agent")
    add.add_argument("--title", required=True)
    add.add_argument("--id", default=None)
    src = add.add_mutually_exclusive_group(required=True)
    src.add_argument("--file", type=Path)
    src.add_argument("--text")
    for name in ("show", "retry", "cancel"):
        sub.add_parser(name).add_argument("task_id")
    lst = sub.add_parser("list")
    lst.add_argument("--agent", default="agent")
    args = parser.parse_args(argv)
    client = WorkflowClient(ControlPlane())
    if args.cmd == "brain-add":
        text = args.file.read_text(encoding="utf-8") if args.file else args.text
        page = client.add_brain_page(args.agent, args.title, text, args.id)
        print(orjson.dumps({"id": page.id, "title": page.title, "chars": len(page.text)}).decode())
    elif args.cmd == "list":
        print(orjson.dumps([t.view() for t in client.list(args.agent)], option=orjson.OPT_INDENT_2).decode())
    else:
        task = getattr(client, args.cmd)(args.task_id)
        print(orjson.dumps(task.view(with_schema=True), option=orjson.OPT_INDENT_2).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
