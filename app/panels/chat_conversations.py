"""The Chat panel's conversations (app.panels.chat.ChatPanel mixes this in): the list (searched, labelled),
open, new, rename, delete, export and import, and the open conversation's own settings (system prompt, output
format, overflow policy) kept in the store as they change."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog, QInputDialog, QListWidgetItem, QMenu, QMessageBox

from app import chat_export
from app.chat_context import DEFAULT_POLICY
from app.chat_text import conversation_label, interrupted_text, list_time, shown, stored_stats
from app.sampling import OutputFormat
from app.store import INTERRUPTED, NEW_TITLE, Conversation, Message
from app.widgets.messages import MessageWidget

_output_format_key = chat_export.output_format_key


class ConversationsMixin:
    """For ChatPanel only: uses its store, widgets (app.panels.chat_view) and its _abort_pending, cancel_edit,
    _message_widget, schedule_meter and _update_controls."""

    def refresh_conversations(self) -> None:
        self.conv_list.blockSignals(True)
        self.conv_list.clear()
        convs = self.store.conversations(self.search.text().strip())
        for c in convs:
            item = QListWidgetItem(conversation_label(c, convs))
            item.setData(Qt.UserRole, c.id)
            item.setToolTip(f"{c.title}\nStarted {list_time(c.created)} · last change {list_time(c.updated)}")
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
        self._show_messages()
        self.messages.set_placeholder("Start the conversation below." if not self.messages.widgets() else "")
        self.refresh_conversations()
        self._update_controls()
        self.schedule_meter()

    def _show_messages(self) -> None:
        """The open conversation's messages, as stored (each reply under the model that wrote it)."""
        self.messages.clear()
        for m in self.store.messages(self.conversation.id):
            w = self._message_widget(m.role, m.content, m.id, (m.model or "Assistant") if m.role == "assistant" else "")
            if m.role == "assistant":
                self._show_stored_reply(w, m)
            self.messages.add(w)

    def _show_stored_reply(self, w: MessageWidget, m: Message) -> None:
        """A stored reply's text, stats, why it was interrupted, and which of its versions it is."""
        w.set_title(m.model or "Assistant")
        w.set_text(shown("assistant", m.content))
        w.set_stats(stored_stats(m))
        w.set_error(interrupted_text(m.error) if m.finish_reason == INTERRUPTED else (m.error or ""))
        w.set_versions(m.version, m.version_count)

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
        menu.addAction("Export as Markdown…", lambda: self._export_dialog("md", cid))
        menu.addAction("Export as JSON…", lambda: self._export_dialog("json", cid))
        menu.addAction("Delete", lambda: self.delete_conversation(cid))
        menu.exec(self.conv_list.mapToGlobal(pos))

    def export_conversation(self, conversation_id: int, path: str) -> Path:
        """Write a conversation to ``path`` (Markdown for .md, JSON otherwise)."""
        return chat_export.export_to_file(self.store, conversation_id, path)

    def import_conversation(self, path: str) -> Conversation | None:
        """Add the conversation exported as JSON at ``path`` and open it; a file that is not one is refused
        (the notice says why) and nothing is added."""
        try:
            conv = chat_export.import_from_file(self.store, path)
        except ValueError as e:
            self.notice.setText(f"Not imported: {e}")
            return None
        self.search.clear()
        self.open_conversation_force(conv.id)
        self.notice.setText(f"Imported “{conv.title}” ({len(self.store.messages(conv.id))} messages).")
        return conv

    def _export_dialog(self, kind: str, conversation_id: int | None = None) -> None:
        cid = conversation_id if conversation_id is not None else (self.conversation.id if self.conversation else None)
        conv = self.store.conversation(cid) if cid is not None else None
        if conv is None:
            return
        name = "".join(c if c.isalnum() or c in " -_" else "_" for c in conv.title).strip() or "conversation"
        filters = "Markdown (*.md)" if kind == "md" else "JSON (*.json)"
        path, _ = QFileDialog.getSaveFileName(self, "Export conversation", str(Path.home() / f"{name}.{kind}"), filters)
        if not path:
            return
        if not Path(path).suffix:
            path += f".{kind}"
        try:
            self.export_conversation(conv.id, path)
        except (OSError, ValueError) as e:
            self.notice.setText(f"Not exported: {e}")
        else:
            self.notice.setText(f"Exported “{conv.title}” to {path}.")

    def _import_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Import conversation", str(Path.home()),
                                              "Kestrel conversation (*.json);;All files (*)")
        if path:
            self.import_conversation(path)

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
