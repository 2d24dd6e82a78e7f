"""Chat: conversations (listed, searched, renamed, deleted; kept in SQLite), a system prompt per
conversation, sampling settings per model, streamed Markdown replies with their TTFT, tokens/s and token
count; stop, regenerate, edit-and-resend.

The context meter under the composer (app/widgets/context_meter.py) counts the next turn (the conversation, the
draft and the reply's max tokens) with the loaded model's tokenizer and chat template, on the engine worker's loop
(never on the GUI thread): a debounced count whose answer comes back through a queued signal. Each send goes
through the conversation's overflow policy (app.chat_context) the same way before it reaches the engine: old
turns are left out and max tokens clamped so that a long chat keeps working at the context limit.

The model picker above the conversation (app/widgets/model_picker.py) switches the loaded model without leaving
the chat; it is disabled while a reply streams."""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass, field

from PySide6.QtCore import QObject, Qt, QTimer, Signal
from PySide6.QtGui import QPainter
from PySide6.QtWidgets import (
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QMessageBox,
    QPlainTextEdit,
    QPushButton,
    QSizePolicy,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from app.chat_context import DEFAULT_POLICY, Fit, fit_messages
from app.context import AppContext
from app.sampling import OutputFormat, SamplingSettings
from app.store import NEW_TITLE, Conversation
from app.widgets.context_meter import ContextMeter
from app.widgets.messages import Composer, MessageList, MessageWidget
from app.widgets.model_picker import ModelPicker
from app.widgets.output_format import OutputFormatEditor
from app.widgets.sampling_form import SamplingForm
from app.widgets.tool_calls import readable_tool_calls
from app.workers.engine_worker import LOADING, READY, ReplyStats

RENDER_INTERVAL_MS = 50  # streaming re-render at most 20 times a second
METER_DELAY_MS = 250  # the context meter recounts this long after the last change


@dataclass
class _Pending:
    request_id: str
    conversation_id: int
    widget: MessageWidget | None
    text: str = ""
    dirty: bool = False
    history: list[dict] = field(default_factory=list)
    settings: SamplingSettings | None = None
    output: OutputFormat | None = None  # the conversation's output format when the turn was sent


def _output_format_key(conversation_id: int) -> str:
    """The prefs key of a conversation's output format (conversation ids are never reused: AUTOINCREMENT)."""
    return f"chat.output_format.{conversation_id}"


class _Bridge(QObject):
    """Brings the answers of counts run on the engine's loop back to the GUI thread (a queued signal)."""

    done = Signal(str, object)  # tag, app.chat_context.Fit | None (no model) | Exception


async def _fit_on_loop(engine, messages: list[dict], max_tokens: int, policy: str) -> Fit | None:
    """On the engine worker's loop: the next turn under ``policy``, counted with the model's tokenizer."""
    client = engine.client
    if client is None or client.info is None:
        return None

    async def count(msgs: list[dict]) -> int:
        if not msgs:
            return 0
        return len(await client.tokenize(messages=msgs, add_generation_prompt=True))

    return await fit_messages(messages, count, int(client.info.max_model_len), max_tokens, policy)


def format_stats(stats: ReplyStats) -> str:
    parts = []
    if stats.ttft is not None:
        parts.append(f"TTFT {stats.ttft:.2f} s")
    if stats.tokens_per_s is not None:
        parts.append(f"{stats.tokens_per_s:.1f} tok/s")
    parts.append(f"{stats.num_tokens} tokens")
    note = {"abort": "stopped", "length": "max tokens reached"}.get(stats.finish_reason or "")
    if note:
        parts.append(note)
    return " · ".join(parts)


class ChatPanel(QWidget):
    def __init__(self, ctx: AppContext):
        super().__init__()
        self.ctx = ctx
        self.store = ctx.store
        self.engine = ctx.engine
        self.conversation: Conversation | None = None
        self.pending: _Pending | None = None
        self.editing_id: int | None = None
        self._render_timer = QTimer(self)
        self._render_timer.setInterval(RENDER_INTERVAL_MS)
        self._render_timer.timeout.connect(self._render_pending)
        self._save_timer = QTimer(self)
        self._save_timer.setSingleShot(True)
        self._save_timer.setInterval(400)
        self._save_timer.timeout.connect(self._save_settings)
        self._bridge = _Bridge(self)
        self._bridge.done.connect(self._on_fit_done)
        self._meter_gen = 0
        self.meter_fit: Fit | None = None  # the last count of the next turn (tests read it)
        self._meter_timer = QTimer(self)
        self._meter_timer.setSingleShot(True)
        self._meter_timer.setInterval(METER_DELAY_MS)
        self._meter_timer.timeout.connect(self.update_meter)
        self._build()
        self.engine.delta.connect(self._on_delta)
        self.engine.replyFinished.connect(self._on_finished)
        self.engine.replyFailed.connect(self._on_failed)
        self.engine.stateChanged.connect(self._on_engine_state)
        self.engine.loaded.connect(self._on_model_loaded)
        self.refresh_conversations()
        convs = self.store.conversations()
        if convs:
            self.open_conversation(convs[0].id)
        self._on_engine_state(self.engine.state)

    # ------------------------------------------------------------------------------------------------
    # layout

    def _build(self) -> None:
        root = QHBoxLayout(self)
        root.setContentsMargins(12, 12, 12, 12)
        split = QSplitter(Qt.Horizontal)
        root.addWidget(split)

        left = QWidget()
        ll = QVBoxLayout(left)
        ll.setContentsMargins(0, 0, 6, 0)
        self.new_button = QPushButton("New chat")
        self.new_button.setObjectName("primary")
        self.new_button.clicked.connect(self.new_conversation)
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search conversations")
        self.search.setClearButtonEnabled(True)
        self.search.textChanged.connect(self.refresh_conversations)
        self.conv_list = QListWidget()
        self.conv_list.setObjectName("conversations")
        self.conv_list.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.conv_list.setTextElideMode(Qt.ElideRight)
        # the open conversation stands out (a style sheet's ::item rule hides the list's selection colours)
        self.conv_list.itemClicked.connect(lambda item: self.open_conversation(item.data(Qt.UserRole)))
        self.conv_list.itemDoubleClicked.connect(lambda item: self.rename_conversation(item.data(Qt.UserRole)))
        self.conv_list.setContextMenuPolicy(Qt.CustomContextMenu)
        self.conv_list.customContextMenuRequested.connect(self._conversation_menu)
        ll.addWidget(self.new_button)
        ll.addWidget(self.search)
        ll.addWidget(self.conv_list, 1)
        conv_buttons = QHBoxLayout()
        self.rename_button = QPushButton("Rename")
        self.rename_button.clicked.connect(lambda: self.conversation and self.rename_conversation(self.conversation.id))
        self.delete_button = QPushButton("Delete")
        self.delete_button.setObjectName("danger")
        self.delete_button.clicked.connect(lambda: self.conversation and self.delete_conversation(self.conversation.id))
        conv_buttons.addWidget(self.rename_button)
        conv_buttons.addWidget(self.delete_button)
        ll.addLayout(conv_buttons)
        split.addWidget(left)

        center = QWidget()
        cl = QVBoxLayout(center)
        cl.setContentsMargins(6, 0, 6, 0)
        head = QHBoxLayout()
        self.title = _TitleLabel(NEW_TITLE)
        self.title.setObjectName("pageTitle")
        self.title.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)  # a long title gives way to the picker
        self.title.setMinimumWidth(120)
        head.addWidget(self.title, 1)
        model_label = QLabel("Model:")
        model_label.setObjectName("hint")
        head.addWidget(model_label)
        self.model_picker = ModelPicker(self.ctx, busy=lambda: self.pending is not None)
        self.model_picker.problem.connect(self.notice_text)
        model_label.setBuddy(self.model_picker)
        head.addWidget(self.model_picker)
        cl.addLayout(head)
        self.messages = MessageList()
        cl.addWidget(self.messages, 1)
        self.editing_banner = QWidget()
        eb = QHBoxLayout(self.editing_banner)
        eb.setContentsMargins(0, 0, 0, 0)
        lab = QLabel("Editing a message: sending replaces it and every reply after it.")
        lab.setObjectName("warningBox")
        eb.addWidget(lab, 1)
        cancel_edit = QPushButton("Cancel edit")
        cancel_edit.clicked.connect(self.cancel_edit)
        eb.addWidget(cancel_edit)
        self.editing_banner.hide()
        cl.addWidget(self.editing_banner)
        self.notice = QLabel()
        self.notice.setObjectName("hint")
        self.notice.setWordWrap(True)
        cl.addWidget(self.notice)
        row = QHBoxLayout()
        self.composer = Composer()
        self.composer.submitted.connect(self.send)
        self.composer.textChanged.connect(self._meter_timer.start)
        row.addWidget(self.composer, 1)
        buttons = QVBoxLayout()
        self.send_button = QPushButton("Send")
        self.send_button.setObjectName("primary")
        self.send_button.clicked.connect(lambda: self.send(self.composer.toPlainText()))
        self.stop_button = QPushButton("Stop")
        self.stop_button.clicked.connect(self.stop)
        self.stop_button.hide()
        self.regenerate_button = QPushButton("Regenerate")
        self.regenerate_button.clicked.connect(self.regenerate)
        buttons.addWidget(self.send_button)
        buttons.addWidget(self.stop_button)
        buttons.addWidget(self.regenerate_button)
        buttons.addStretch(1)
        row.addLayout(buttons)
        cl.addLayout(row)
        self.meter = ContextMeter()
        self.meter.policyChanged.connect(self._overflow_changed)
        self.meter_bar, self.meter_label, self.meter_note = self.meter.bar, self.meter.label, self.meter.note
        self.overflow = self.meter.overflow
        cl.addWidget(self.meter)
        split.addWidget(center)

        right = QWidget()
        rl = QVBoxLayout(right)
        rl.setContentsMargins(6, 0, 0, 0)
        sys_label = QLabel("System prompt")
        sys_label.setObjectName("messageRole")
        rl.addWidget(sys_label)
        self.system_prompt = QPlainTextEdit()
        self.system_prompt.setPlaceholderText("Optional: how the assistant should behave in this conversation")
        self.system_prompt.setFixedHeight(110)
        self.system_prompt.textChanged.connect(self._system_prompt_changed)
        rl.addWidget(self.system_prompt)
        fmt_label = QLabel("Output format")
        fmt_label.setObjectName("messageRole")
        rl.addWidget(fmt_label)
        self.output_format = OutputFormatEditor()
        self.output_format.changed.connect(self._output_format_changed)
        rl.addWidget(self.output_format)
        samp_label = QLabel("Sampling")
        samp_label.setObjectName("messageRole")
        rl.addWidget(samp_label)
        self.sampling = SamplingForm()
        self.sampling.set_settings(SamplingSettings())
        self.sampling.changed.connect(self._save_timer.start)
        self.sampling.changed.connect(self._meter_timer.start)
        rl.addWidget(self.sampling)
        self.defaults_button = QPushButton("Reset to the model's defaults")
        self.defaults_button.clicked.connect(self.reset_sampling)
        rl.addWidget(self.defaults_button)
        self.defaults_note = QLabel()
        self.defaults_note.setObjectName("hint")
        self.defaults_note.setWordWrap(True)
        rl.addWidget(self.defaults_note)
        rl.addStretch(1)
        split.addWidget(right)
        split.setSizes([230, 720, 270])
        split.setStretchFactor(1, 1)

    # ------------------------------------------------------------------------------------------------
    # conversations

    def refresh_conversations(self) -> None:
        self.conv_list.blockSignals(True)
        self.conv_list.clear()
        for c in self.store.conversations(self.search.text().strip()):
            item = QListWidgetItem(c.title)
            item.setData(Qt.UserRole, c.id)
            item.setToolTip(c.title)
            self.conv_list.addItem(item)
            if self.conversation is not None and c.id == self.conversation.id:
                item.setSelected(True)
                self.conv_list.setCurrentItem(item)
        self.conv_list.blockSignals(False)

    def new_conversation(self) -> Conversation:
        self._abort_pending()
        conv = self.store.create_conversation()
        self.search.clear()
        self.open_conversation(conv.id)
        self.composer.setFocus()
        return conv

    def open_conversation(self, conversation_id: int) -> None:
        if self.conversation is not None and self.conversation.id == conversation_id and self.messages.widgets():
            return
        self._abort_pending()
        self.cancel_edit()
        self.conversation = self.store.conversation(conversation_id)
        if self.conversation is None:
            return
        self.title.setText(self.conversation.title)
        self.title.setToolTip(self.conversation.title)
        self.system_prompt.blockSignals(True)
        self.system_prompt.setPlainText(self.conversation.system_prompt)
        self.system_prompt.blockSignals(False)
        self.output_format.set_value(OutputFormat.from_dict(self.store.pref(_output_format_key(conversation_id))))
        self.meter.set_policy(self.conversation.overflow_policy)
        self.messages.clear()
        for m in self.store.messages(conversation_id):  # each reply under the model that wrote it
            w = self._message_widget(m.role, m.content, m.id, (m.model or "Assistant") if m.role == "assistant" else "")
            if m.role == "assistant":
                w.set_stats(format_stats(ReplyStats(m.finish_reason, m.num_tokens or 0, 0, m.ttft, m.tokens_per_s)))
            self.messages.add(w)
        self.messages.set_placeholder("Start the conversation below." if not self.messages.widgets() else "")
        self.refresh_conversations()
        self._update_controls()
        self.schedule_meter()

    def rename_conversation(self, conversation_id: int, title: str | None = None) -> None:
        conv = self.store.conversation(conversation_id)
        if conv is None:
            return
        if title is None:
            title, ok = QInputDialog.getText(self, "Rename conversation", "Title:", text=conv.title)
            if not ok:
                return
        self.store.rename_conversation(conversation_id, title)
        if self.conversation is not None and self.conversation.id == conversation_id:
            self.conversation = self.store.conversation(conversation_id)
            self.title.setText(self.conversation.title)
            self.title.setToolTip(self.conversation.title)
        self.refresh_conversations()

    def delete_conversation(self, conversation_id: int, confirm: bool = True) -> None:
        conv = self.store.conversation(conversation_id)
        if conv is None:
            return
        if confirm and QMessageBox.question(self, "Delete conversation",
                                            f"Delete “{conv.title}” and all its messages?") != QMessageBox.Yes:
            return
        if self.conversation is not None and self.conversation.id == conversation_id:
            self._abort_pending()
            self.conversation = None
            self.messages.clear()
            self.title.setText(NEW_TITLE)
            self.meter.set_policy(DEFAULT_POLICY)
        self.store.delete_conversation(conversation_id)
        self.refresh_conversations()
        remaining = self.store.conversations()
        if self.conversation is None and remaining:
            self.open_conversation(remaining[0].id)
        self._update_controls()

    def _conversation_menu(self, pos) -> None:
        item = self.conv_list.itemAt(pos)
        if item is None:
            return
        cid = item.data(Qt.UserRole)
        menu = QMenu(self)
        menu.addAction("Rename…", lambda: self.rename_conversation(cid))
        menu.addAction("Delete", lambda: self.delete_conversation(cid))
        menu.exec(self.conv_list.mapToGlobal(pos))

    def _system_prompt_changed(self) -> None:
        if self.conversation is not None:
            self.store.set_system_prompt(self.conversation.id, self.system_prompt.toPlainText())
        self.schedule_meter()

    def _output_format_changed(self) -> None:
        if self.conversation is not None:
            self.store.set_pref(_output_format_key(self.conversation.id), self.output_format.value().to_dict())

    def overflow_policy(self) -> str:
        return self.meter.policy()

    def _overflow_changed(self, _policy: str) -> None:
        if self.conversation is not None:
            self.store.set_overflow_policy(self.conversation.id, self.overflow_policy())
            self.conversation = self.store.conversation(self.conversation.id)
        self.schedule_meter()

    def notice_text(self, text: str) -> None:
        self.notice.setText(text)

    # ------------------------------------------------------------------------------------------------
    # sending

    def send(self, text: str) -> bool:
        """Send ``text`` as the user's next message (replacing the edited one when editing)."""
        text = text.strip()
        if not text or self.pending is not None or self.engine.state != READY:
            return False
        if self.conversation is None:
            self.conversation = self.store.create_conversation()
            self.store.set_overflow_policy(self.conversation.id, self.overflow_policy())
            self.store.set_system_prompt(self.conversation.id, self.system_prompt.toPlainText())  # typed before
            self._output_format_changed()  # chosen before too
            self.conversation = self.store.conversation(self.conversation.id)
        conv_id = self.conversation.id
        if self.editing_id is not None:
            self.store.delete_messages_from(conv_id, self.editing_id)
            self.editing_id = None
            self.editing_banner.hide()
            self.open_conversation_force(conv_id)
        msg = self.store.add_message(conv_id, "user", text)
        self.messages.add(self._message_widget("user", text, msg.id))
        if self.conversation.title == NEW_TITLE:
            self.rename_conversation(conv_id, _title_from(text))
        self.composer.clear()
        self._start_reply()
        return True

    def regenerate(self) -> None:
        """Replace the last reply with a new one (or answer the last message when there is no reply)."""
        if self.conversation is None or self.pending is not None or self.engine.state != READY:
            return
        msgs = self.store.messages(self.conversation.id)
        if not msgs:
            return
        if msgs[-1].role == "assistant":
            self.store.delete_messages_from(self.conversation.id, msgs[-1].id)
            widgets = self.messages.widgets()
            if widgets and widgets[-1].role == "assistant":
                self.messages.remove(widgets[-1])
        elif self.messages.widgets() and self.messages.widgets()[-1].role == "assistant":
            self.messages.remove(self.messages.widgets()[-1])  # a failed reply's frame
        self._start_reply()

    def stop(self) -> None:
        if self.pending is not None:
            self.engine.abort(self.pending.request_id)

    def edit_message(self, widget: MessageWidget) -> None:
        if self.pending is not None or widget.message_id is None:
            return
        self.editing_id = widget.message_id
        self.composer.setPlainText(widget.text)
        self.composer.setFocus()
        self.editing_banner.show()

    def cancel_edit(self) -> None:
        if self.editing_id is not None:
            self.composer.clear()
        self.editing_id = None
        self.editing_banner.hide()

    def open_conversation_force(self, conversation_id: int) -> None:
        self.conversation = None
        self.open_conversation(conversation_id)

    def _start_reply(self) -> None:
        conv = self.store.conversation(self.conversation.id)
        history = [{"role": m.role, "content": m.content} for m in self.store.messages(conv.id)
                   if m.content or m.role == "user"]
        if conv.system_prompt.strip():
            history.insert(0, {"role": "system", "content": conv.system_prompt})
        rid = f"chat-{uuid.uuid4().hex[:12]}"
        widget = self.messages.add(self._message_widget("assistant", "", None, self._assistant_name()))
        settings = self.sampling.settings()
        output = self.output_format.value()
        self.pending = _Pending(rid, conv.id, widget, history=history, settings=settings, output=output)
        try:
            settings.to_params(output)
        except ValueError as e:  # InvalidRequestError names the setting; a schema's problem says what it is
            self.pending = None
            widget.set_error(f"Output format: {e}" if output.problem() else str(e))
            self._update_controls()
            return
        # the overflow policy first (counted on the engine's loop), then the request: _on_fit_done
        self._submit_fit(rid, history, settings.max_tokens, conv.overflow_policy)
        self._render_timer.start()
        self._update_controls()

    def _submit_fit(self, tag: str, messages: list[dict], max_tokens: int, policy: str) -> None:
        bridge = self._bridge

        def done(future) -> None:  # on the engine's thread
            try:
                result = future.result()
            except BaseException as e:  # noqa: BLE001 - reported to the GUI
                result = e if isinstance(e, Exception) else None
            try:
                bridge.done.emit(tag, result)
            except RuntimeError:  # the panel is gone
                pass

        self.engine.submit(_fit_on_loop(self.engine, messages, max_tokens, policy)).add_done_callback(done)

    def _on_fit_done(self, tag: str, result) -> None:
        if tag.startswith("meter:"):
            if int(tag[6:]) == self._meter_gen:
                self._show_meter(result)
            return
        p = self.pending
        if p is None or p.request_id != tag:
            return
        settings = p.settings or self.sampling.settings()
        messages = p.history
        if isinstance(result, Fit):
            if not result.ok:
                self.pending = None
                self._render_timer.stop()
                if p.widget is not None:
                    p.widget.set_error(result.error)
                self._show_meter(result)  # the count that refused it, not the one from before the send
                self._update_controls()
                return
            messages = result.messages
            settings = dataclasses.replace(settings, max_tokens=result.max_tokens)
            self._show_note(result.summary())
        self.engine.generate(p.request_id, messages, settings.to_params(p.output))

    # ------------------------------------------------------------------------------------------------
    # the context meter

    def schedule_meter(self) -> None:
        self._meter_timer.start()

    def next_turn_messages(self) -> list[dict]:
        """The next request's messages as things stand: the conversation and the draft (not yet sent)."""
        history: list[dict] = []
        if self.conversation is not None:
            history = [{"role": m.role, "content": m.content} for m in self.store.messages(self.conversation.id)
                       if m.content or m.role == "user"]
            if self.editing_id is not None:
                ids = [m.id for m in self.store.messages(self.conversation.id) if m.content or m.role == "user"]
                history = history[:next((i for i, mid in enumerate(ids) if mid >= self.editing_id), len(ids))]
        system = self.system_prompt.toPlainText()
        if system.strip():
            history.insert(0, {"role": "system", "content": system})
        draft = self.composer.toPlainText().strip()
        if draft:
            history.append({"role": "user", "content": draft})
        return history

    def update_meter(self) -> None:
        """Recount the next turn (on the engine's loop; the answer updates the meter)."""
        self._meter_timer.stop()
        self._meter_gen += 1
        if self.engine.state != READY:
            self._show_meter(None)
            return
        self._submit_fit(f"meter:{self._meter_gen}", self.next_turn_messages(), self.sampling.max_tokens.value(),
                         self.overflow_policy())

    def _show_meter(self, fit) -> None:
        self.meter_fit = fit if isinstance(fit, Fit) else None
        self.meter.show_fit(self.meter_fit, self.engine.state == READY, quiet=self.pending is not None)

    def _show_note(self, text: str) -> None:
        self.meter.show_note(text)

    def _abort_pending(self) -> None:
        if self.pending is not None:
            self.engine.abort(self.pending.request_id)
            self.pending.widget = None  # the reply is still saved when it ends

    # ------------------------------------------------------------------------------------------------
    # engine signals

    def _on_delta(self, rid: str, text: str) -> None:
        p = self.pending
        if p is None or p.request_id != rid:
            return
        p.text += text
        p.dirty = True

    def _render_pending(self) -> None:
        p = self.pending
        if p is not None and p.dirty and p.widget is not None:
            p.widget.set_text(_shown("assistant", p.text))
            p.dirty = False

    def _on_finished(self, rid: str, stats: ReplyStats) -> None:
        p = self.pending
        if p is None or p.request_id != rid:
            return
        self.pending = None
        self._render_timer.stop()
        info = self.engine.info
        msg = self.store.add_message(p.conversation_id, "assistant", p.text, ttft=stats.ttft,
                                     tokens_per_s=stats.tokens_per_s, num_tokens=stats.num_tokens,
                                     finish_reason=stats.finish_reason,
                                     model=self._assistant_name() if info else None)
        if p.widget is not None:
            p.widget.set_text(_shown("assistant", p.text))
            p.widget.message_id = msg.id
            p.widget.set_stats(format_stats(stats))
        self._update_controls()
        self.schedule_meter()

    def _on_failed(self, rid: str, message: str) -> None:
        p = self.pending
        if p is None or p.request_id != rid:
            return
        self.pending = None
        self._render_timer.stop()
        if p.widget is not None:
            p.widget.set_text(_shown("assistant", p.text))
            p.widget.set_error(f"The reply failed: {message}  Use Regenerate to try again.")
        self._update_controls()

    def _on_engine_state(self, state: str) -> None:
        if state == READY:
            self.notice.setText("")
        elif state == LOADING:
            self.notice.setText("Loading the model… you can type meanwhile.")
        else:
            self.notice.setText("No model is loaded: choose one above or in the Load panel to chat.")
        self.model_picker.refresh()
        self._update_controls()
        self.schedule_meter()

    def _on_model_loaded(self, info) -> None:
        key = self.ctx.model_key or info.path
        saved = self.store.model_settings(key).get("sampling")
        defaults = SamplingSettings.from_generation_config(info.generation_config)
        self.sampling.set_settings(SamplingSettings.from_dict(saved) if saved else defaults)
        self.defaults_note.setText("Defaults from the model's generation_config." if info.generation_config
                                   else "The model gives no sampling defaults; Kestrel's are used.")
        name = self._assistant_name()
        self.messages.set_placeholder("" if self.messages.widgets() else f"Chat with {name}.")
        self.schedule_meter()

    def reset_sampling(self) -> None:
        info = self.engine.info
        self.sampling.set_settings(SamplingSettings.from_generation_config(info.generation_config if info else {}))
        self._save_settings()

    def _save_settings(self) -> None:
        key = self.ctx.model_key
        if key:
            self.store.update_model_settings(key, sampling=self.sampling.settings().to_dict())

    # ------------------------------------------------------------------------------------------------

    def _message_widget(self, role: str, text: str, message_id: int | None, title: str = "") -> MessageWidget:
        w = MessageWidget(role, _shown(role, text), title, message_id)
        w.editRequested.connect(self.edit_message)
        w.regenerateRequested.connect(lambda _w: self.regenerate())
        return w

    def _assistant_name(self) -> str:
        """The loaded model as a reply's label (kept with the reply): its name, and int8 when requantized."""
        info = self.engine.info
        if info is None:
            return "Assistant"
        quant = getattr(self.engine.config, "quantization", None)
        return f"{info.name} ({quant})" if quant and quant != "none" else info.name

    def _update_controls(self) -> None:
        busy = self.pending is not None
        ready = self.engine.state == READY
        self.send_button.setVisible(not busy)
        self.stop_button.setVisible(busy)
        self.send_button.setEnabled(ready)
        has_msgs = bool(self.conversation and self.store.messages(self.conversation.id))
        self.regenerate_button.setEnabled(ready and not busy and has_msgs)
        self.rename_button.setEnabled(self.conversation is not None)
        self.delete_button.setEnabled(self.conversation is not None)
        self.model_picker.setEnabled(not busy and self.engine.state != LOADING)
        widgets = self.messages.widgets()
        last_assistant = next((w for w in reversed(widgets) if w.role == "assistant"), None)
        for w in widgets:
            w.set_actions_enabled(ready and not busy, last=w is last_assistant)

    def shutdown(self) -> None:
        """Before the store closes: stop listening and the timers, keep unsaved settings."""
        for signal, slot in ((self.engine.delta, self._on_delta), (self.engine.replyFinished, self._on_finished),
                             (self.engine.replyFailed, self._on_failed)):
            signal.disconnect(slot)
        self.pending = None
        self._render_timer.stop()
        self._meter_timer.stop()
        self._bridge.done.disconnect(self._on_fit_done)
        if self._save_timer.isActive():
            self._save_timer.stop()
            self._save_settings()

    # for tests and the screenshot script
    def message_widgets(self) -> list[MessageWidget]:
        return self.messages.widgets()


class _TitleLabel(QLabel):
    """The conversation's title, elided at the right when the model picker beside it needs the room."""

    def paintEvent(self, _event) -> None:
        painter = QPainter(self)
        rect = self.contentsRect()
        text = self.fontMetrics().elidedText(self.text(), Qt.ElideRight, rect.width())
        self.style().drawItemText(painter, rect, int(self.alignment()), self.palette(), self.isEnabled(), text,
                                  self.foregroundRole())


def _title_from(text: str) -> str:
    first = text.strip().splitlines()[0]
    return first if len(first) <= 48 else first[:47].rstrip() + "…"


def _shown(role: str, text: str) -> str:
    """A message's text as the message view shows it: an assistant's tool calls as readable blocks."""
    return readable_tool_calls(text) if role == "assistant" else text
