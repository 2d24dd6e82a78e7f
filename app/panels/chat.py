"""Chat: conversations (listed, searched, renamed, deleted; kept in SQLite), a system prompt per
conversation, sampling settings per model, streamed Markdown replies with their TTFT, tokens/s and token
count; stop, regenerate, edit-and-resend.

The context meter under the composer (app/widgets/context_meter.py) counts the next turn (the conversation, the
draft and the reply's max tokens) with the loaded model's tokenizer and chat template, on the engine worker's loop
(never on the GUI thread: EngineWorker.count), a debounced count whose answer comes back through a queued signal.
Each send is one call to the worker (EngineWorker.send): there the turn goes through the conversation's overflow
policy (app.chat_context) and is tokenized once before it reaches the engine: old turns are left out and max
tokens clamped so that a long chat keeps working at the context limit. The widgets are built in
app.panels.chat_view, the conversations list in app.panels.chat_conversations, the words in app.chat_text.

The model picker above the conversation (app/widgets/model_picker.py) switches the loaded model without leaving
the chat; it is disabled while a reply streams.

A reply is saved as it streams (app.store: "interrupted", with why, until it finishes), so closing the window or
an engine crash mid-reply leaves the partial reply and its reason in the conversation, never two user turns in a
row. A turn the overflow policy refuses adds nothing: the notice says why and the draft stays in the composer.
Regenerate keeps the earlier replies as versions ("< 2/3 >" on the reply switches between them). While the engine
restarts itself the notice says so ("Restarting engine… (attempt 1 of 3)"), and why when it gives up."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QWidget

from app.chat_context import Fit
from app.chat_text import (
    failure_reason,
    format_stats,
    gave_up_text,
    interrupted_text,
    params_problem,
    request_messages,
    shown,
    title_from,
)
from app.context import AppContext
from app.panels.chat_conversations import ConversationsMixin
from app.panels.chat_view import build_view
from app.sampling import OutputFormat, SamplingSettings
from app.store import INTERRUPTED, NEW_TITLE, Conversation, Message
from app.widgets.messages import MessageWidget
from app.workers.engine_worker import DEAD, LOADING, READY, ReplyStats

try:
    from app.workers.engine_worker import restart_text
except ImportError:  # a worker without its restart words
    def restart_text(attempt: int, most: int) -> str:
        return f"Restarting engine… (attempt {attempt} of {most})"

RENDER_INTERVAL_MS = 50  # streaming re-render at most 20 times a second
SAVE_INTERVAL_S = 1.0  # a streaming reply is saved at least this often
# why a reply is "interrupted", as saved while it streams (what is left if the app is killed) and at the end
STREAMING_REASON = "The app stopped before this reply finished."
CLOSED_REASON = "The app was closed during this reply."
SETTINGS_SHOWN_FROM = 1000  # the chat's right column shows by itself from this panel width (px)
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
    user_text: str | None = None  # a send: the user's message, added once the overflow policy lets it through
    edit_from: int | None = None  # ... replacing this message and every later one (edit and resend)
    regen_of: int | None = None  # a regenerate: the reply that gets a new version (None: answer the last message)
    message_id: int | None = None  # the reply's row, saved as it streams (None until the request starts)
    saved_len: int = 0  # how much of ``text`` is saved
    saved_at: float = 0.0  # when (monotonic)
    cancelled: bool = False  # the user left the conversation before the request started



class ChatPanel(ConversationsMixin, QWidget):
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
        self._meter_gen = 0
        self.meter_fit: Fit | None = None  # the last count of the next turn (tests read it)
        self._meter_timer = QTimer(self)
        self._meter_timer.setSingleShot(True)
        self._meter_timer.setInterval(METER_DELAY_MS)
        self._meter_timer.timeout.connect(self.update_meter)
        self._build()
        self.engine.fitted.connect(self._on_fit_done)
        self.engine.delta.connect(self._on_delta)
        self.engine.replyFinished.connect(self._on_finished)
        self.engine.replyFailed.connect(self._on_failed)
        self.engine.stateChanged.connect(self._on_engine_state)
        # from the click on Load on, not after the loop gets to it: no turn goes to the model being replaced
        if hasattr(self.engine, "loadRequested"):
            self.engine.loadRequested.connect(self._on_load_requested)
        self.engine.loaded.connect(self._on_model_loaded)
        # the engine's own restarts (app.workers.engine_worker): one state in the notice while they last
        if hasattr(self.engine, "restartAttempt"):
            self.engine.restartAttempt.connect(self._on_restart_attempt)
        if hasattr(self.engine, "engineGaveUp"):
            self.engine.engineGaveUp.connect(self._on_engine_gave_up)
        self.engine.engineRestarted.connect(self._on_engine_restarted)
        self.refresh_conversations()
        convs = self.store.conversations()
        if convs:
            self.open_conversation(convs[0].id)
        self._on_engine_state(self.engine.state)

    # ------------------------------------------------------------------------------------------------
    # layout

    def _build(self) -> None:
        build_view(self)

    def _settings_clicked(self, checked: bool) -> None:
        self._settings_auto = False  # the user's choice holds until the window crosses the width again
        self.show_settings(checked)

    def show_settings(self, shown: bool) -> None:
        """Show or hide the right column (system prompt, output format, sampling)."""
        self.settings_panel.setVisible(shown)
        self.settings_button.setChecked(shown)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        wide = event.size().width() >= SETTINGS_SHOWN_FROM
        if event.oldSize().width() > 0 and (event.oldSize().width() >= SETTINGS_SHOWN_FROM) != wide:
            self._settings_auto = True  # crossing the width: the column follows it again
        if self._settings_auto and self.settings_panel.isVisible() != wide:
            self.show_settings(wide)

    # ------------------------------------------------------------------------------------------------
    # sending

    def send(self, text: str) -> bool:
        """Send ``text`` as the user's next message (replacing the edited one when editing). It is added once
        the overflow policy lets the turn through; a refused turn adds nothing and the notice says why."""
        text = text.strip()
        if not text or self.pending is not None or not self._accepting():
            return False
        settings, output = self.sampling.settings(), self.output_format.value()
        problem = params_problem(settings, output)
        if problem:  # refused in place: nothing reaches the store or the engine
            self._refuse(problem)
            return False
        # None: a new chat, created once the turn goes ahead (_begin_reply)
        conv = self.store.conversation(self.conversation.id) if self.conversation is not None else None
        earlier = self.store.messages(conv.id) if conv is not None else []
        if self.editing_id is not None:
            earlier = [m for m in earlier if m.id < self.editing_id]
        system = conv.system_prompt if conv is not None else self.system_prompt.toPlainText()
        history = ([{"role": "system", "content": system}] if system.strip() else []) + request_messages(
            earlier, [{"role": "user", "content": text}])
        self._start_reply(_Pending(f"chat-{uuid.uuid4().hex[:12]}", conv.id if conv is not None else None, None,
                                   history=history, settings=settings, output=output, user_text=text,
                                   edit_from=self.editing_id))
        return True

    def regenerate(self) -> None:
        """A new version of the last reply (the earlier ones are kept), or a reply to the last message when
        it has none."""
        if self.conversation is None or self.pending is not None or not self._accepting():
            return
        conv = self.store.conversation(self.conversation.id)
        msgs = self.store.messages(conv.id)
        if not msgs:
            return
        settings, output = self.sampling.settings(), self.output_format.value()
        problem = params_problem(settings, output)
        if problem:
            self._refuse(problem)
            return
        target = msgs[-1] if msgs[-1].role == "assistant" else None
        history = self._request_history(conv, msgs[:-1] if target else msgs)
        self._start_reply(_Pending(f"chat-{uuid.uuid4().hex[:12]}", conv.id, None, history=history,
                                   settings=settings, output=output, regen_of=target.id if target else None))

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

    def _request_history(self, conv: Conversation, msgs: list[Message]) -> list[dict]:
        """What the engine gets for ``msgs``: the system prompt first, replies without text left out, and
        user messages that follow each other (after a reply that failed before any text) joined as one, so
        that the roles alternate as chat templates require."""
        history = [{"role": "system", "content": conv.system_prompt}] if conv.system_prompt.strip() else []
        return history + request_messages(msgs)

    def _refuse(self, why: str) -> None:
        """A turn that is not sent: say why where the user is looking (the draft stays in the composer)."""
        self.notice.setText(f"Not sent: {why}")
        self.notice.setProperty("refused", True)

    def _start_reply(self, p: _Pending) -> None:
        """One call to the engine worker: the overflow policy (counted on the engine's loop), then the request
        when the turn fits. Its ``fitted`` answer comes first (_on_fit_done), then the reply's signals."""
        self.pending = p
        conv = self.store.conversation(p.conversation_id) if p.conversation_id is not None else None
        self.engine.send(p.request_id, p.history, p.settings.to_params(p.output),
                         conv.overflow_policy if conv is not None else self.overflow_policy())
        self._update_controls()

    def _on_fit_done(self, tag: str, result) -> None:
        """The worker's fit of a turn (the request follows it unless the fit refused it) or of the meter's count."""
        if tag.startswith("meter:"):
            if int(tag[6:]) == self._meter_gen:
                self._show_meter(result)
            return
        p = self.pending
        if p is None or p.request_id != tag:
            return
        if p.cancelled or (p.conversation_id is not None and self.store.conversation(p.conversation_id) is None):
            self.engine.abort(p.request_id)  # the request after the fit: not for this conversation any more
            self.pending = None
            self._update_controls()
            return
        if isinstance(result, Fit):
            if not result.ok:  # nothing added: the notice and the meter say why, the draft stays
                self.pending = None
                self._refuse(result.error)
                self._show_meter(result)  # the count that refused it, not the one from before the send
                self._update_controls()
                return
            self._show_note(result.summary())
        if self.notice.property("refused"):
            self.notice.setText("")
            self.notice.setProperty("refused", False)
        self._begin_reply(p)
        self._render_timer.start()

    def _begin_reply(self, p: _Pending) -> None:
        """The turn goes ahead: the user's message (for a send) and the reply's row, saved as "interrupted"
        until it finishes, in the store and the view."""
        if p.conversation_id is None:  # a new chat's first turn
            conv = self.store.create_conversation()
            self.store.set_overflow_policy(conv.id, self.overflow_policy())
            self.store.set_system_prompt(conv.id, self.system_prompt.toPlainText())  # typed before
            self.conversation = self.store.conversation(conv.id)
            self._output_format_changed()  # chosen before too
            p.conversation_id = conv.id
            self.refresh_conversations()
        conv_id = p.conversation_id
        name = self._assistant_name()
        if p.user_text is not None:
            if p.edit_from is not None:
                self.store.delete_messages_from(conv_id, p.edit_from)
                self.editing_id = None
                self.editing_banner.hide()
                self._show_messages()
            msg = self.store.add_message(conv_id, "user", p.user_text)
            self.messages.add(self._message_widget("user", p.user_text, msg.id))
            if self.conversation.title == NEW_TITLE:
                self.rename_conversation(conv_id, title_from(p.user_text))
            if self.composer.toPlainText().strip() == p.user_text:
                self.composer.clear()
        streaming = {"finish_reason": INTERRUPTED, "error": STREAMING_REASON, "model": name if self.engine.info
                     else None, "ttft": None, "tokens_per_s": None, "num_tokens": None}
        widget = None
        old = self.store.message(p.regen_of) if p.regen_of is not None else None
        if old is not None:
            if old.content.strip():
                m = self.store.add_version(old.id, "", **streaming)
            else:  # a reply that failed before any text is replaced, not kept as a version
                m = self.store.update_message(old.id, content="", **streaming)
            widget = next((w for w in self.messages.widgets() if w.message_id == old.id), None)
            if widget is not None:
                self._show_stored_reply(widget, m)
                widget.set_error("")
                widget.set_stats("")
        else:
            m = self.store.add_message(conv_id, "assistant", "", **streaming)
        if widget is None:
            widget = self.messages.add(self._message_widget("assistant", "", m.id, name))
            widget.set_versions(m.version, m.version_count)
        p.message_id, p.widget = m.id, widget
        p.saved_at = time.monotonic()
        self._update_controls()

    # ------------------------------------------------------------------------------------------------
    # the context meter

    def schedule_meter(self) -> None:
        self._meter_timer.start()

    def next_turn_messages(self) -> list[dict]:
        """The next request's messages as things stand: the conversation and the draft (not yet sent)."""
        msgs: list[Message] = []
        if self.conversation is not None:
            msgs = self.store.messages(self.conversation.id)
            if self.editing_id is not None:
                msgs = [m for m in msgs if m.id < self.editing_id]
        system = self.system_prompt.toPlainText()
        history = [{"role": "system", "content": system}] if system.strip() else []
        draft = self.composer.toPlainText().strip()
        return history + request_messages(msgs, [{"role": "user", "content": draft}] if draft else [])

    def update_meter(self) -> None:
        """Recount the next turn (on the engine's loop; the answer updates the meter)."""
        self._meter_timer.stop()
        self._meter_gen += 1
        if self.engine.state != READY:
            self._show_meter(None)
            return
        self.engine.count(f"meter:{self._meter_gen}", self.next_turn_messages(), self.sampling.max_tokens.value(),
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
            self.pending.cancelled = True  # not started yet: it will not be

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
        if p is None:
            return
        if p.dirty and p.widget is not None:
            p.widget.set_text(shown("assistant", p.text))
            p.dirty = False
        if p.message_id is not None and len(p.text) != p.saved_len and \
                time.monotonic() - p.saved_at >= SAVE_INTERVAL_S:
            self._save_partial(p)

    def _save_partial(self, p: _Pending, reason: str | None = None) -> None:
        """The streaming reply as far as it got (still "interrupted"; ``reason``: why it ended)."""
        fields = {"content": p.text}
        if reason is not None:
            fields.update(finish_reason=INTERRUPTED, error=reason)
        self.store.update_message(p.message_id, **fields)
        p.saved_len, p.saved_at = len(p.text), time.monotonic()

    def _on_finished(self, rid: str, stats: ReplyStats) -> None:
        p = self.pending
        if p is None or p.request_id != rid:
            return
        self.pending = None
        self._render_timer.stop()
        if p.message_id is not None:
            self.store.update_message(p.message_id, content=p.text, ttft=stats.ttft, tokens_per_s=stats.tokens_per_s,
                                      num_tokens=stats.num_tokens, finish_reason=stats.finish_reason, error=None)
        if p.widget is not None:
            p.widget.set_text(shown("assistant", p.text))
            p.widget.set_stats(format_stats(stats))
            p.widget.set_error("")
        self._update_controls()
        self.schedule_meter()

    def _on_failed(self, rid: str, message: str) -> None:
        p = self.pending
        if p is None or p.request_id != rid:
            return
        self.pending = None
        self._render_timer.stop()
        reason = failure_reason(message)
        if p.message_id is not None:
            self._save_partial(p, reason)
        if p.widget is not None:
            p.widget.set_text(shown("assistant", p.text))
            p.widget.set_error(interrupted_text(reason))
            p.widget.set_stats("interrupted")
        self._update_controls()
        self.schedule_meter()

    def _accepting(self) -> bool:
        """A turn can go to the engine: a model is ready and no load was asked for since (see EngineWorker)."""
        return getattr(self.engine, "accepting", self.engine.state == READY)

    def _on_load_requested(self) -> None:
        self.notice.setText("Loading the model… you can type meanwhile.")
        self.notice.setProperty("refused", False)
        self._update_controls()

    def _on_engine_state(self, state: str) -> None:
        if state == READY:  # a load asked for: the model before, about to be replaced
            self.notice.setText("Loading the model… you can type meanwhile."
                                if getattr(self.engine, "load_pending", False) else "")
        elif state == LOADING:
            self.notice.setText("Loading the model… you can type meanwhile.")
        elif state == DEAD:
            attempt = getattr(self.engine, "restart_attempt", None)
            if attempt:
                self._on_restart_attempt(*attempt, "")
            else:  # engineGaveUp says why
                self.notice.setText(gave_up_text(getattr(self.engine, "dead_reason", "")))
        else:
            self.notice.setText("No model is loaded: choose one above or in the Load panel to chat.")
        self.notice.setProperty("refused", False)
        self.model_picker.refresh()
        self._update_controls()
        self.schedule_meter()

    def _on_restart_attempt(self, attempt: int, most: int, _why: str) -> None:
        """The engine died and restarts by itself: one state, the attempt it is at."""
        if self.engine.state != READY:
            self.notice.setText(f"{restart_text(attempt, most)}: the engine stopped; your conversation is kept.")

    def _on_engine_gave_up(self, reason: str) -> None:
        self.notice.setText(gave_up_text(reason))

    def _on_engine_restarted(self, _notice: str) -> None:
        if self.engine.state != READY:
            return
        msgs = self.store.messages(self.conversation.id) if self.conversation is not None else []
        if msgs and msgs[-1].role == "assistant" and msgs[-1].finish_reason == INTERRUPTED:
            self.notice.setText("The engine runs again. Regenerate retries the interrupted reply.")
        else:
            self.notice.setText("The engine runs again.")

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
        w = MessageWidget(role, shown(role, text), title, message_id)
        w.editRequested.connect(self.edit_message)
        w.regenerateRequested.connect(lambda _w: self.regenerate())
        w.versionRequested.connect(self.show_version)
        return w

    def show_version(self, widget: MessageWidget, index: int) -> None:
        """Show another version of a regenerated reply (it is what the next turns send)."""
        if self.pending is not None or widget.message_id is None:
            return
        m = self.store.select_version(widget.message_id, index)
        if m is not None:
            self._show_stored_reply(widget, m)
            self.schedule_meter()

    def _assistant_name(self) -> str:
        """The loaded model as a reply's label (kept with the reply): its name, and int8 when requantized."""
        info = self.engine.info
        if info is None:
            return "Assistant"
        quant = getattr(self.engine.config, "quantization", None)
        return f"{info.name} ({quant})" if quant and quant not in ("none", "auto") else info.name

    def _update_controls(self) -> None:
        busy = self.pending is not None
        ready = self._accepting()
        self.send_button.setVisible(not busy)
        self.stop_button.setVisible(busy)
        self.send_button.setEnabled(ready)
        has_msgs = bool(self.conversation and self.store.messages(self.conversation.id))
        self.regenerate_button.setEnabled(ready and not busy and has_msgs)
        self.rename_button.setEnabled(self.conversation is not None)
        self.export_button.setEnabled(self.conversation is not None)
        self.delete_button.setEnabled(self.conversation is not None)
        self.model_picker.setEnabled(not busy and self.engine.state != LOADING
                                     and not getattr(self.engine, "load_pending", False))
        widgets = self.messages.widgets()
        last_assistant = next((w for w in reversed(widgets) if w.role == "assistant"), None)
        for w in widgets:
            w.set_actions_enabled(ready and not busy, last=w is last_assistant)
            w.set_versions_enabled(not busy)

    def shutdown(self) -> None:
        """Before the store closes: stop listening and the timers, keep unsaved settings, and a reply still
        streaming as far as it got (interrupted: the app was closed)."""
        for signal, slot in ((self.engine.delta, self._on_delta), (self.engine.replyFinished, self._on_finished),
                             (self.engine.replyFailed, self._on_failed), (self.engine.fitted, self._on_fit_done)):
            signal.disconnect(slot)
        p, self.pending = self.pending, None
        if p is not None and p.message_id is not None:
            self.engine.abort(p.request_id)
            self._save_partial(p, CLOSED_REASON)
        self._render_timer.stop()
        self._meter_timer.stop()
        if self._save_timer.isActive():
            self._save_timer.stop()
            self._save_settings()

    # for tests and the screenshot script
    def message_widgets(self) -> list[MessageWidget]:
        return self.messages.widgets()
