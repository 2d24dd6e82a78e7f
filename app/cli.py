"""The `kestrel` command (pyproject's entry point), above both packages: with no arguments, or with only the
app's own flags (--no-autoload, --panel), it opens the desktop app (app.main); every other command line
(generate, chat, bench, serve, --help) goes to the engine's commands, engine.cli.main. Qt is imported only
for the app and torch only by the engine commands that load a model. Nothing imports this module."""

from __future__ import annotations

import argparse
import logging
import sys

APP_FLAGS = ("--no-autoload", "--panel")  # app.main's options
APP_HELP = "Without a command, kestrel opens the desktop app (the GUI). Its options:"


def app_help() -> str:
    """The epilog of `kestrel --help`: the desktop app and its options, from app.main's own parser."""
    # Qt's side only for the app; torch only for the engine commands that load a model
    from app.main import build_parser

    parser = build_parser()
    lines = [APP_HELP]
    for action in parser._actions:
        if action.option_strings and "-h" not in action.option_strings:
            flag = action.option_strings[0]
            if action.choices:
                flag += " {" + ",".join(action.choices) + "}"
            lines.append(f"  kestrel {flag}: {action.help}")
    return "\n".join(lines)


def opens_the_app(argv: list[str]) -> bool:
    """True for the command lines that open the desktop app: none, or the app's own flags."""
    return not argv or argv[0].split("=", 1)[0] in APP_FLAGS


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if opens_the_app(argv):
        from app.main import main as app_main

        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
        return app_main(argv)
    from engine import cli as engine_cli

    if argv[0] in ("-h", "--help"):  # the engine's commands, and a word on the app
        parser = engine_cli.build_parser()
        parser.formatter_class = argparse.RawDescriptionHelpFormatter
        parser.epilog = app_help()
        parser.print_help()
        return 0
    return engine_cli.main(argv)


if __name__ == "__main__":
    sys.exit(main())
