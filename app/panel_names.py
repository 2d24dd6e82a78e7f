"""The main window's panels, in the sidebar's order: app.window.PANELS is built from these, and app.main's
--panel offers them (Qt-free, for `kestrel --help`; the window imports this module, not app.main, which imports
the window)."""

PANEL_LABELS = {"chat": "Chat", "models": "Models", "load": "Load", "server": "Server",
                "performance": "Performance", "benchmark": "Benchmark", "hardware": "Hardware"}
PANEL_NAMES = list(PANEL_LABELS)
