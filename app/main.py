"""Start the app: check that a window can open (and say what to install when Qt's xcb plugin cannot load),
create the QApplication and the main window, show it, then start the work (library scan, model load) once
the event loop runs. Nothing here imports torch: the engine runs in its own process."""

from __future__ import annotations

import argparse
import signal
import sys

from app.panel_names import PANEL_NAMES  # every panel can be opened first with --panel


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kestrel", description="Kestrel desktop app")
    p.add_argument("--no-autoload", action="store_true", help="Start without loading a model")
    p.add_argument("--panel", default="chat", choices=PANEL_NAMES, help="Panel to show first")
    return p


def create_app(argv: list[str] | None = None):
    # Qt after qt_check's checks (a missing xcb plugin is said in words, not a crash)
    from PySide6.QtWidgets import QApplication

    from app import resources, theme

    app = QApplication.instance() or QApplication(argv if argv is not None else sys.argv[:1])
    app.setApplicationName("Kestrel")
    app.setOrganizationName("Kestrel")
    app.setDesktopFileName("kestrel")
    app.setStyle("Fusion")
    theme.apply(app, theme.resolve(theme.SYSTEM))  # the window applies the saved setting (app.theme.ThemeManager)
    app.setWindowIcon(resources.icon("kestrel"))
    return app


def create_window(store=None, core_factory: str | None = None, hardware_interval_ms: int = 1000):
    """The main window with its context (workers started); ``window.start()`` begins the work."""
    from app import paths
    from app.context import AppContext
    from app.store import Store
    from app.window import MainWindow

    ctx = AppContext(store or Store(paths.db_path()), core_factory=core_factory,
                     hardware_interval_ms=hardware_interval_ms)
    return MainWindow(ctx)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from app.qt_check import check_display, check_pyside, check_xcb

    problem = check_pyside() or check_display() or check_xcb()
    if problem:
        print(problem, file=sys.stderr)
        return 1
    from PySide6.QtCore import QTimer

    app = create_app()
    window = create_window()
    window.show_panel(args.panel)
    window.show()
    QTimer.singleShot(0, lambda: window.start(autoload=not args.no_autoload))
    app.aboutToQuit.connect(window.shutdown)
    signal.signal(signal.SIGINT, lambda *_: app.quit())  # Ctrl-C in the terminal closes the app cleanly
    ticker = QTimer()
    ticker.start(250)  # let Python see the signal while Qt's loop runs
    ticker.timeout.connect(lambda: None)
    return app.exec()


if __name__ == "__main__":
    sys.exit(main())
