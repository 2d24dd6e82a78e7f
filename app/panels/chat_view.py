"""The Chat panel's widgets (app.panels.chat.ChatPanel builds itself with ``build_view``): the conversations on
the left, the messages, notice, composer and context meter in the middle, the conversation's settings on the
right. Layout only: what the widgets do is the panel's."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QPainter
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QMenu,
    QPlainTextEdit,
    QPushButton,
    QSizePolicy,
    QSplitter,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.sampling import SamplingSettings
from app.store import NEW_TITLE
from app.widgets.context_meter import ContextMeter
from app.widgets.messages import Composer, MessageList
from app.widgets.model_picker import ModelPicker
from app.widgets.output_format import OutputFormatEditor
from app.widgets.sampling_form import SamplingForm


def build_view(panel) -> None:
    """The chat's widgets onto ``panel`` (a ChatPanel): the conversations on the left, the messages, the notice,
    the composer and the context meter in the middle, the system prompt, output format and sampling on the right;
    each connected to the panel's own methods."""
    root = QHBoxLayout(panel)
    root.setContentsMargins(12, 12, 12, 12)
    split = QSplitter(Qt.Horizontal)
    split.setChildrenCollapsible(False)
    panel.split = split
    root.addWidget(split)

    left = QWidget()
    ll = QVBoxLayout(left)
    ll.setContentsMargins(0, 0, 6, 0)
    panel.new_button = QPushButton("New chat")
    panel.new_button.setObjectName("primary")
    panel.new_button.clicked.connect(panel.new_conversation)
    panel.search = QLineEdit()
    panel.search.setPlaceholderText("Search conversations")
    panel.search.setClearButtonEnabled(True)
    panel.search.textChanged.connect(panel.refresh_conversations)
    panel.conv_list = QListWidget()
    panel.conv_list.setObjectName("conversations")
    panel.conv_list.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
    panel.conv_list.setTextElideMode(Qt.ElideRight)
    # the open conversation stands out (a style sheet's ::item rule hides the list's selection colours)
    panel.conv_list.itemClicked.connect(lambda item: panel.open_conversation(item.data(Qt.UserRole)))
    panel.conv_list.itemDoubleClicked.connect(lambda item: panel.rename_conversation(item.data(Qt.UserRole)))
    panel.conv_list.setContextMenuPolicy(Qt.CustomContextMenu)
    panel.conv_list.customContextMenuRequested.connect(panel._conversation_menu)
    ll.addWidget(panel.new_button)
    ll.addWidget(panel.search)
    ll.addWidget(panel.conv_list, 1)
    conv_buttons = QHBoxLayout()
    panel.rename_button = QPushButton("Rename")
    panel.rename_button.clicked.connect(lambda: panel.conversation and panel.rename_conversation(panel.conversation.id))
    panel.delete_button = QPushButton("Delete")
    panel.delete_button.setObjectName("danger")
    panel.delete_button.clicked.connect(lambda: panel.conversation and panel.delete_conversation(panel.conversation.id))
    conv_buttons.addWidget(panel.rename_button)
    conv_buttons.addWidget(panel.delete_button)
    ll.addLayout(conv_buttons)
    io_buttons = QHBoxLayout()
    panel.export_button = QPushButton("Export")
    panel.export_button.setToolTip("Save this conversation as Markdown (to read) or JSON (to import again)")
    export_menu = QMenu(panel.export_button)
    export_menu.addAction("As Markdown (.md)…", lambda: panel._export_dialog("md"))
    export_menu.addAction("As JSON (.json)…", lambda: panel._export_dialog("json"))
    panel.export_button.setMenu(export_menu)
    panel.import_button = QPushButton("Import…")
    panel.import_button.setToolTip("Open a conversation exported as JSON (from Kestrel)")
    panel.import_button.clicked.connect(panel._import_dialog)
    io_buttons.addWidget(panel.export_button)
    io_buttons.addWidget(panel.import_button)
    ll.addLayout(io_buttons)
    split.addWidget(left)

    center = QWidget()
    cl = QVBoxLayout(center)
    cl.setContentsMargins(6, 0, 6, 0)
    head = QHBoxLayout()
    panel.title = TitleLabel(NEW_TITLE)
    panel.title.setObjectName("pageTitle")
    panel.title.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)  # a long title gives way to the picker
    panel.title.setMinimumWidth(90)
    head.addWidget(panel.title, 1)
    model_label = QLabel("Model:")
    model_label.setObjectName("hint")
    head.addWidget(model_label)
    panel.model_picker = ModelPicker(panel.ctx, busy=lambda: panel.pending is not None)
    panel.model_picker.problem.connect(panel.notice_text)
    model_label.setBuddy(panel.model_picker)
    panel.model_picker.setMinimumWidth(170)  # a long model name gives way on a narrow window (elided)
    head.addWidget(panel.model_picker)
    # the right column (system prompt, output format, sampling) folds away on a narrow window
    panel.settings_button = QToolButton()
    panel.settings_button.setText("Settings")
    panel.settings_button.setCheckable(True)
    panel.settings_button.setChecked(True)
    panel.settings_button.setToolTip("Show or hide the system prompt, output format and sampling settings")
    panel.settings_button.clicked.connect(panel._settings_clicked)
    head.addWidget(panel.settings_button)
    cl.addLayout(head)
    panel.messages = MessageList()
    cl.addWidget(panel.messages, 1)
    panel.editing_banner = QWidget()
    eb = QHBoxLayout(panel.editing_banner)
    eb.setContentsMargins(0, 0, 0, 0)
    lab = QLabel("Editing a message: sending replaces it and every reply after it.")
    lab.setObjectName("warningBox")
    eb.addWidget(lab, 1)
    cancel_edit = QPushButton("Cancel edit")
    cancel_edit.clicked.connect(panel.cancel_edit)
    eb.addWidget(cancel_edit)
    panel.editing_banner.hide()
    cl.addWidget(panel.editing_banner)
    panel.notice = QLabel()
    panel.notice.setObjectName("hint")
    panel.notice.setWordWrap(True)
    cl.addWidget(panel.notice)
    row = QHBoxLayout()
    panel.composer = Composer()
    panel.composer.submitted.connect(panel.send)
    panel.composer.textChanged.connect(panel._meter_timer.start)
    row.addWidget(panel.composer, 1)
    buttons = QVBoxLayout()
    panel.send_button = QPushButton("Send")
    panel.send_button.setObjectName("primary")
    panel.send_button.clicked.connect(lambda: panel.send(panel.composer.toPlainText()))
    panel.stop_button = QPushButton("Stop")
    panel.stop_button.clicked.connect(panel.stop)
    panel.stop_button.hide()
    panel.regenerate_button = QPushButton("Regenerate")
    panel.regenerate_button.clicked.connect(panel.regenerate)
    buttons.addWidget(panel.send_button)
    buttons.addWidget(panel.stop_button)
    buttons.addWidget(panel.regenerate_button)
    buttons.addStretch(1)
    row.addLayout(buttons)
    cl.addLayout(row)
    panel.meter = ContextMeter()
    panel.meter.policyChanged.connect(panel._overflow_changed)
    panel.meter_bar, panel.meter_label, panel.meter_note = panel.meter.bar, panel.meter.label, panel.meter.note
    panel.overflow = panel.meter.overflow
    cl.addWidget(panel.meter)
    split.addWidget(center)

    right = QWidget()
    panel.settings_panel = right
    panel._settings_auto = True  # shown or hidden by the width until the user chooses
    rl = QVBoxLayout(right)
    rl.setContentsMargins(6, 0, 0, 0)
    sys_label = QLabel("System prompt")
    sys_label.setObjectName("messageRole")
    rl.addWidget(sys_label)
    panel.system_prompt = QPlainTextEdit()
    panel.system_prompt.setPlaceholderText("Optional: how the assistant should behave in this conversation")
    panel.system_prompt.setFixedHeight(110)
    panel.system_prompt.textChanged.connect(panel._system_prompt_changed)
    rl.addWidget(panel.system_prompt)
    fmt_label = QLabel("Output format")
    fmt_label.setObjectName("messageRole")
    rl.addWidget(fmt_label)
    panel.output_format = OutputFormatEditor()
    panel.output_format.changed.connect(panel._output_format_changed)
    rl.addWidget(panel.output_format)
    samp_label = QLabel("Sampling")
    samp_label.setObjectName("messageRole")
    rl.addWidget(samp_label)
    panel.sampling = SamplingForm()
    panel.sampling.set_settings(SamplingSettings())
    panel.sampling.changed.connect(panel._save_timer.start)
    panel.sampling.changed.connect(panel._meter_timer.start)
    rl.addWidget(panel.sampling)
    panel.defaults_button = QPushButton("Reset to defaults")
    panel.defaults_button.setToolTip("Set the sampling settings back to the loaded model's defaults")
    panel.defaults_button.clicked.connect(panel.reset_sampling)
    rl.addWidget(panel.defaults_button)
    panel.defaults_note = QLabel()
    panel.defaults_note.setObjectName("hint")
    panel.defaults_note.setWordWrap(True)
    rl.addWidget(panel.defaults_note)
    rl.addStretch(1)
    split.addWidget(right)
    split.setSizes([230, 720, 270])
    split.setStretchFactor(1, 1)


class TitleLabel(QLabel):
    """The conversation's title, elided at the right when the model picker beside it needs the room."""

    def paintEvent(self, _event) -> None:
        painter = QPainter(self)
        rect = self.contentsRect()
        text = self.fontMetrics().elidedText(self.text(), Qt.ElideRight, rect.width())
        self.style().drawItemText(painter, rect, int(self.alignment()), self.palette(), self.isEnabled(), text,
                                  self.foregroundRole())
