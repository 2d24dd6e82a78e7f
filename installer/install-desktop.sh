#!/usr/bin/env bash
# Add Kestrel to the user's applications menu and PATH (no root needed; installer/uninstall.sh undoes it):
#   ${XDG_DATA_HOME:-~/.local/share}/applications/kestrel.desktop   the menu entry, Exec = <venv>/bin/kestrel
#   ${XDG_DATA_HOME:-~/.local/share}/icons/hicolor/scalable/apps/kestrel.svg   the icon
#   ${KESTREL_BIN_DIR:-~/.local/bin}/kestrel   a symlink to <venv>/bin/kestrel
# Run installer/setup.sh first (or installer/setup.sh --desktop, which runs both).
# Environment: KESTREL_VENV (default: .venv in the checkout), XDG_DATA_HOME, KESTREL_BIN_DIR.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${KESTREL_VENV:-$here/.venv}"
data_home="${XDG_DATA_HOME:-$HOME/.local/share}"
apps_dir="$data_home/applications"
icon_dir="$data_home/icons/hicolor/scalable/apps"
bin_dir="${KESTREL_BIN_DIR:-$HOME/.local/bin}"

say() { printf '\033[1m[kestrel desktop]\033[0m %s\n' "$*"; }
die() { printf '\033[31m[kestrel desktop] %s\033[0m\n' "$*" >&2; exit 1; }

case "${1:-}" in
  "") ;;
  -h|--help) sed -n '2,7p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) die "unknown option $1 (see --help)" ;;
esac

# Absolute paths only: the menu runs the entry from anywhere.
[[ "$venv" == /* ]] || venv="$PWD/$venv"
exe="$venv/bin/kestrel"
[[ -x "$exe" ]] || die "$exe not found: run installer/setup.sh first (or installer/setup.sh --desktop)"

# An Exec value: plain when it has only safe characters, else double-quoted with ", `, $ and \ escaped
# (the desktop entry spec), then every \ doubled (the string-value escape) and % doubled (field codes).
exec_value() {
  local s="$1"
  if [[ "$s" =~ ^[A-Za-z0-9_./+-]+$ ]]; then
    printf '%s' "$s"
    return
  fi
  s="${s//\\/\\\\}"; s="${s//\"/\\\"}"; s="${s//\`/\\\`}"; s="${s//\$/\\\$}"
  s="\"$s\""
  s="${s//\\/\\\\}"; s="${s//%/%%}"
  printf '%s' "$s"
}
# TryExec is a plain string value: only \ needs escaping.
try_exec="${exe//\\/\\\\}"

mkdir -p "$apps_dir" "$icon_dir" "$bin_dir"

desktop="$apps_dir/kestrel.desktop"
# Written next door first (desktop-file-validate wants the .desktop extension), then moved into place.
tmp_dir="$(mktemp -d)"
trap 'rm -rf "$tmp_dir"' EXIT
tmp="$tmp_dir/kestrel.desktop"
{
  while IFS= read -r line || [[ -n "$line" ]]; do
    case "$line" in
      Exec=*) printf 'Exec=%s\n' "$(exec_value "$exe")"
              printf 'TryExec=%s\n' "$try_exec" ;;
      TryExec=*|X-Kestrel-*) ;;
      *) printf '%s\n' "$line" ;;
    esac
  done < "$here/resources/kestrel.desktop"
  # The X11 window class Qt gives the app ("Kestrel", its application name), so docks group the window
  # with this entry (on Wayland app.main's setDesktopFileName("kestrel") does it).
  grep -q '^StartupWMClass=' "$here/resources/kestrel.desktop" || printf 'StartupWMClass=Kestrel\n'
  # Marks the entry as written by this script (uninstall.sh removes only such an entry).
  printf 'X-Kestrel-Venv=%s\n' "${venv//\\/\\\\}"
} > "$tmp"
chmod 644 "$tmp"
if command -v desktop-file-validate >/dev/null; then
  desktop-file-validate "$tmp" >&2 || die "desktop-file-validate rejected the entry"
fi
mv -f "$tmp" "$desktop"
say "menu entry: $desktop"

install -m 644 "$here/resources/icons/kestrel.svg" "$icon_dir/kestrel.svg"
say "icon: $icon_dir/kestrel.svg"

link="$bin_dir/kestrel"
if [[ -e "$link" || -L "$link" ]] && [[ ! -L "$link" ]]; then
  say "$link exists and is not a symlink: left as it is (remove it and run this again to link $exe)"
else
  ln -sfn "$exe" "$link"
  say "command: $link -> $exe"
  case ":$PATH:" in
    *":$bin_dir:"*) ;;
    *) say "$bin_dir is not on your PATH: add it (e.g. in ~/.profile: export PATH=\"$bin_dir:\$PATH\")" ;;
  esac
fi

# Refresh the caches where the tools exist (menus pick the changes up without them too, a little later).
command -v update-desktop-database >/dev/null && update-desktop-database -q "$apps_dir" 2>/dev/null || true
if command -v gtk-update-icon-cache >/dev/null && [[ -f "$data_home/icons/hicolor/index.theme" ]]; then
  gtk-update-icon-cache -q -t "$data_home/icons/hicolor" 2>/dev/null || true
fi
say "done: Kestrel is in the applications menu; installer/uninstall.sh removes it"
