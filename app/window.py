"""The main window: a sidebar of panels (and the theme setting), the panels, a status bar with the engine and
server state, the keyboard shortcuts of app.shortcuts and their help overlay."""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QComboBox,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QMainWindow,
    QPushButton,
    QStackedWidget,
    QStyledItemDelegate,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app import resources, shortcuts
from app import theme as themes
from app.context import AppContext
from app.panel_names import PANEL_LABELS, PANEL_NAMES
from app.panels.benchmark import BenchmarkPanel
from app.panels.chat import ChatPanel
from app.panels.hardware import HardwarePanel
from app.panels.load import LoadPanel, weights_text
from app.panels.models import ModelsPanel
from app.panels.performance import PerformancePanel
from app.panels.server import ServerPanel
from app.workers.engine_worker import DEAD, EMPTY, FAILED, LOADING, READY, restart_text

PANELS = [(name, PANEL_LABELS[name]) for name in PANEL_NAMES]
SIDEBAR_WIDTH, SIDEBAR_NARROW = 190, 56
# below this window width the sidebar shows only its icons (their names in tooltips), leaving the panels room
COMPACT_BELOW = 1200


def stopped_text(reason: str, most: int = 90) -> str:
    """The status bar's line for an engine dead for good: the reason's first sentence, shortened to fit beside the
    Reload button at 1024 px (the whole reason in the label's tooltip, the Load panel and the chat's notice)."""
    line = reason.strip().splitlines()[0] if reason.strip() else "the engine process ended"
    line = line.split(". ", 1)[0].rstrip(".") + "."
    line = line if len(line) <= most else line[:most - 1].rstrip() + "…"
    return f"The engine stopped: {line}"


class MainWindow(QMainWindow):
    def __init__(self, ctx: AppContext):
        super().__init__()
        self.ctx = ctx
        self.setWindowTitle("Kestrel")
        self.setWindowIcon(resources.icon("kestrel"))
        self.resize(1320, 840)
        self._closed = False
        central = QWidget()
        lay = QHBoxLayout(central)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(0)
        side = QWidget()
        side.setObjectName("appSidebar")  # not "sidebar": QFileDialog's own sidebar has that name
        side.setAttribute(Qt.WA_StyledBackground, True)
        side.setFixedWidth(SIDEBAR_WIDTH)
        self.sidebar = side
        self.compact = False
        sl = QVBoxLayout(side)
        sl.setContentsMargins(0, 0, 0, 0)
        sl.setSpacing(0)
        brand = QLabel("Kestrel")
        brand.setObjectName("brand")
        self.brand = brand
        sl.addWidget(brand)
        self.nav = QListWidget()
        self.nav.setObjectName("nav")
        self.nav.setIconSize(QSize(18, 18))
        self.nav.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)  # folded to icons, nothing to scroll to
        sl.addWidget(self.nav, 1)
        self.sidebar_footer = self._sidebar_footer()
        sl.addWidget(self.sidebar_footer)
        lay.addWidget(side)
        self.stack = QStackedWidget()
        lay.addWidget(self.stack, 1)
        self.setCentralWidget(central)

        self.panels = {
            "chat": ChatPanel(ctx), "models": ModelsPanel(ctx), "load": LoadPanel(ctx),
            "server": ServerPanel(ctx), "performance": PerformancePanel(ctx), "benchmark": BenchmarkPanel(ctx),
            "hardware": HardwarePanel(ctx),
        }
        for name, label in PANELS:
            item = QListWidgetItem(resources.icon(name), label)
            item.setData(Qt.UserRole, name)
            item.setToolTip(label)
            self.nav.addItem(item)
            self.stack.addWidget(self.panels[name])
        self.nav.currentRowChanged.connect(self.stack.setCurrentIndex)
        self.nav.setCurrentRow(0)
        ctx.navigate.connect(self.show_panel)

        self.engine_label = QLabel()
        self.server_label = QLabel()
        self.reload_button = QPushButton("Reload model")
        self.reload_button.hide()
        self.reload_button.clicked.connect(self._reload)
        self.statusBar().addWidget(self.engine_label, 1)
        self.statusBar().addPermanentWidget(self.reload_button)
        self.statusBar().addPermanentWidget(self.server_label)
        ctx.engine.stateChanged.connect(self._on_engine_state)
        ctx.engine.loadProgress.connect(self._on_load_progress)
        ctx.engine.restartAttempt.connect(self._on_restart_attempt)
        ctx.engine.engineGaveUp.connect(self._on_engine_gave_up)
        ctx.server.started.connect(self._on_server_started)
        ctx.server.stopped.connect(self._on_server_stopped)
        self.server_label.setText("Endpoint: off")
        self._on_engine_state(ctx.engine.state)

        self.theme = themes.ThemeManager(ctx.store, self)
        self.theme.changed.connect(self._on_theme_changed)
        self._on_theme_changed(themes.current())
        self._show_theme_choice()
        self.shortcut_table = shortcuts.table(PANELS)
        self.shortcuts: list[QShortcut] = []
        for row in self.shortcut_table:
            if row.action:
                self._add_shortcut(row)
        self.help_overlay = shortcuts.HelpOverlay(self.shortcut_table, self)

    def _sidebar_footer(self) -> QWidget:
        foot = QWidget()
        fl = QVBoxLayout(foot)
        fl.setContentsMargins(12, 6, 12, 10)
        fl.setSpacing(4)
        self.help_button = QToolButton()
        self.help_button.setObjectName("sidebarLink")
        self.help_button.setText("Keyboard shortcuts (F1)")
        self.help_button.setCursor(Qt.PointingHandCursor)
        self.help_button.clicked.connect(self.shortcut_help)
        fl.addWidget(self.help_button, 0, Qt.AlignLeft)
        self.theme_row = QWidget()
        row = QHBoxLayout(self.theme_row)
        row.setContentsMargins(0, 0, 0, 0)
        label = QLabel("Theme")
        label.setObjectName("sidebarLabel")
        self.theme_choice = QComboBox()
        self.theme_choice.setObjectName("themeChoice")
        self.theme_choice.setToolTip("System follows the desktop's light or dark setting")
        # the list takes the style sheet's item colours, not the combo's light-on-dark text (the default delegate
        # draws the items with the combo's palette: light grey on the white list)
        self.theme_choice.setItemDelegate(QStyledItemDelegate(self.theme_choice))
        for key, text in themes.CHOICES.items():
            self.theme_choice.addItem(text, key)
        self.theme_choice.currentIndexChanged.connect(self._theme_chosen)
        row.addWidget(label)
        row.addWidget(self.theme_choice, 1)
        fl.addWidget(self.theme_row)
        return foot

    def _show_theme_choice(self) -> None:
        self.theme_choice.blockSignals(True)
        self.theme_choice.setCurrentIndex(max(0, self.theme_choice.findData(self.theme.choice)))
        self.theme_choice.blockSignals(False)

    def _theme_chosen(self, _index: int) -> None:
        self.theme.set_choice(self.theme_choice.currentData())

    def _on_theme_changed(self, theme: themes.Theme) -> None:
        """The style sheet and palette reach every widget; a panel that paints colours of its own (plots)
        gets ``apply_theme(theme)`` when it has one."""
        for panel in self.panels.values():
            if hasattr(panel, "apply_theme"):
                panel.apply_theme(theme)

    # ------------------------------------------------------------------------------------------------
    # keyboard shortcuts (app.shortcuts.table): each row with an action calls shortcut_<action>(arg)

    def _add_shortcut(self, row: shortcuts.Shortcut) -> None:
        handler = getattr(self, f"shortcut_{row.action}")
        parent = self.chat if row.scope == "chat" else self
        for keys in row.keys:
            sc = QShortcut(QKeySequence(keys), parent)
            sc.setContext(Qt.WidgetWithChildrenShortcut if row.scope == "chat" else Qt.WindowShortcut)
            sc.setObjectName(f"shortcut:{row.action}{':' + row.arg if row.arg else ''}")
            if row.arg:
                sc.activated.connect(lambda arg=row.arg, h=handler: h(arg))
            else:
                sc.activated.connect(handler)
            self.shortcuts.append(sc)

    def shortcut(self, action: str, arg: str = "") -> list[QShortcut]:
        """The QShortcuts of a table row (tests activate them)."""
        name = f"shortcut:{action}{':' + arg if arg else ''}"
        return [s for s in self.shortcuts if s.objectName() == name]

    def _to_chat(self) -> None:
        self.help_overlay.close_overlay()
        self.show_panel("chat")

    def shortcut_new_chat(self) -> None:
        self._to_chat()
        self.chat.new_conversation()

    def shortcut_stop(self) -> None:
        if self.help_overlay.isVisible():
            self.help_overlay.close_overlay()
        else:
            self.chat.stop()

    def shortcut_regenerate(self) -> None:
        self._to_chat()
        self.chat.regenerate()

    def shortcut_focus_composer(self) -> None:
        self._to_chat()
        self.chat.composer.setFocus(Qt.ShortcutFocusReason)

    def shortcut_panel(self, name: str) -> None:
        self.help_overlay.close_overlay()
        self.show_panel(name)

    def shortcut_help(self) -> None:
        self.help_overlay.toggle()

    @property
    def chat(self) -> ChatPanel:
        return self.panels["chat"]

    def show_panel(self, name: str) -> None:
        self.nav.setCurrentRow([n for n, _ in PANELS].index(name))

    def start(self, autoload: bool = True) -> None:
        """After the window shows: scan the library, and load the model (the last one, else the default)."""
        self.ctx.library.refresh()
        if autoload:
            self.panels["load"].autoload()

    # slots for worker signals are bound methods: a lambda would run on the worker's thread
    def _on_load_progress(self, text: str) -> None:
        self.engine_label.setText(text)  # "Loading weights…", "Starting the engine process…": words of their own

    def _on_server_started(self, url: str, _model: str) -> None:
        self.server_label.setText(f"Endpoint: {url}/v1")

    def _on_server_stopped(self, _why: str) -> None:
        self.server_label.setText("Endpoint: off")

    def _on_engine_state(self, state: str) -> None:
        info = self.ctx.engine.info
        text = {
            EMPTY: "No model loaded",
            LOADING: "Loading the model…",
            FAILED: "The model could not be loaded (see Load)",
            DEAD: "The engine stopped",
        }.get(state, "")
        if state == READY and info is not None:
            text = (f"● {info.name}  ·  {weights_text(info, self.ctx.engine.config)}  ·  {info.device}  ·  "
                    f"context {info.max_model_len:,}  ·  TP {info.tensor_parallel_size}")
        if state == DEAD:
            engine = self.ctx.engine
            if engine.restart_attempt is not None:  # restarting by itself: nothing to press yet
                text = restart_text(*engine.restart_attempt)
            elif engine.dead_reason:
                text = stopped_text(engine.dead_reason)
        self.engine_label.setText(text)
        self.engine_label.setToolTip(self.ctx.engine.dead_reason if state == DEAD else "")
        self._show_reload()

    def _show_reload(self) -> None:
        """Reload is offered once the engine is dead for good: not while it restarts by itself."""
        engine = self.ctx.engine
        self.reload_button.setVisible(engine.state == DEAD and engine.restart_attempt is None)

    def _on_restart_attempt(self, attempt: int, most: int, why: str) -> None:
        self.engine_label.setText(restart_text(attempt, most))
        self.engine_label.setToolTip(why)
        self.reload_button.hide()

    def _on_engine_gave_up(self, reason: str) -> None:
        self.engine_label.setText(stopped_text(reason))
        self.engine_label.setToolTip(reason)
        self.reload_button.setToolTip(f"Load {self.ctx.engine.info.name if self.ctx.engine.info else 'the model'} "
                                      "again with the same settings")
        self._show_reload()

    def _reload(self) -> None:
        config = self.ctx.engine.config
        if config is not None:
            self.ctx.load_model(self.ctx.model_key or "", config)

    def shutdown(self) -> None:
        if not self._closed:
            self._closed = True
            self.theme.disconnect_system()
            for panel in self.panels.values():
                if hasattr(panel, "shutdown"):
                    panel.shutdown()
            self.ctx.shutdown()

    def set_compact(self, compact: bool) -> None:
        """The sidebar as icons only (compact) or with the panels' names, the help link and the theme choice."""
        if compact == self.compact:
            return
        self.compact = compact
        self.sidebar.setFixedWidth(SIDEBAR_NARROW if compact else SIDEBAR_WIDTH)
        self.brand.setText("K" if compact else "Kestrel")
        self.brand.setAlignment(Qt.AlignHCenter if compact else Qt.AlignLeft | Qt.AlignVCenter)
        for i, (_name, label) in enumerate(PANELS):
            self.nav.item(i).setText("" if compact else label)
        self.help_button.setText("?" if compact else "Keyboard shortcuts (F1)")
        self.help_button.setToolTip("Keyboard shortcuts (F1)")
        self.theme_row.setVisible(not compact)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self.set_compact(event.size().width() < COMPACT_BELOW)

    def resize(self, *size) -> None:
        """As QWidget.resize; a width the full sidebar does not leave room for folds it first (a window dragged
        smaller folds it on the way, at COMPACT_BELOW)."""
        width = size[0].width() if len(size) == 1 else size[0]
        if width < COMPACT_BELOW and not self.compact:
            self.set_compact(True)
            self.centralWidget().layout().activate()  # the smaller minimum width now, before the resize
            self.layout().activate()
        super().resize(*size)

    def closeEvent(self, event) -> None:
        self.hide()
        self.shutdown()
        super().closeEvent(event)
