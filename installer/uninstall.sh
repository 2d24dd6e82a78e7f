#!/usr/bin/env bash
# Remove what installer/install-desktop.sh added: the menu entry, the icon and the ~/.local/bin/kestrel link.
#   installer/uninstall.sh                 only those (the virtualenv, models and chats stay)
#   installer/uninstall.sh --purge         ... and the virtualenv (with its build directory)
#   installer/uninstall.sh --delete-data   ... and Kestrel's data folder: conversations, settings, the app's
#                                          own models folder (${KESTREL_DATA_DIR:-${XDG_DATA_HOME:-~/.local/share}/kestrel})
# Models downloaded from the Hugging Face Hub live in the Hugging Face cache that other tools share
# (${HF_HUB_CACHE:-${HF_HOME:-~/.cache/huggingface}/hub}); this script never removes them.
# Environment: KESTREL_VENV (default: .venv in the checkout), XDG_DATA_HOME, KESTREL_BIN_DIR, KESTREL_DATA_DIR.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${KESTREL_VENV:-$here/.venv}"
[[ "$venv" == /* ]] || venv="$PWD/$venv"
data_home="${XDG_DATA_HOME:-$HOME/.local/share}"
bin_dir="${KESTREL_BIN_DIR:-$HOME/.local/bin}"
# Where app/paths.py keeps the user data (platformdirs' user_data_path("kestrel") on Linux).
data_dir="${KESTREL_DATA_DIR:-$data_home/kestrel}"
if [[ -n "${HF_HUB_CACHE:-}" ]]; then hf_cache="$HF_HUB_CACHE"
elif [[ -n "${HF_HOME:-}" ]]; then hf_cache="$HF_HOME/hub"
else hf_cache="${XDG_CACHE_HOME:-$HOME/.cache}/huggingface/hub"; fi

say() { printf '\033[1m[kestrel uninstall]\033[0m %s\n' "$*"; }
die() { printf '\033[31m[kestrel uninstall] %s\033[0m\n' "$*" >&2; exit 1; }

purge=0
delete_data=0
for arg in "$@"; do
  case "$arg" in
    --purge) purge=1 ;;
    --delete-data) delete_data=1 ;;
    -h|--help) sed -n '2,9p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option $arg (see --help)" ;;
  esac
done

desktop="$data_home/applications/kestrel.desktop"
if [[ -f "$desktop" ]]; then
  if grep -q '^X-Kestrel-Venv=' "$desktop"; then
    rm -f "$desktop"
    say "removed $desktop"
    command -v update-desktop-database >/dev/null && update-desktop-database -q "$data_home/applications" 2>/dev/null || true
  else
    say "$desktop was not written by install-desktop.sh: left as it is"
  fi
fi

icon="$data_home/icons/hicolor/scalable/apps/kestrel.svg"
if [[ -f "$icon" ]]; then
  rm -f "$icon"
  say "removed $icon"
  if command -v gtk-update-icon-cache >/dev/null && [[ -f "$data_home/icons/hicolor/index.theme" ]]; then
    gtk-update-icon-cache -q -t "$data_home/icons/hicolor" 2>/dev/null || true
  fi
fi

link="$bin_dir/kestrel"
if [[ -L "$link" ]]; then
  target="$(readlink "$link")"
  if [[ "$target" == */bin/kestrel ]]; then
    rm -f "$link"
    say "removed $link (-> $target)"
  else
    say "$link points to $target, not to a Kestrel virtualenv: left as it is"
  fi
elif [[ -e "$link" ]]; then
  say "$link is not a symlink made by install-desktop.sh: left as it is"
fi

if [[ $purge -eq 1 ]]; then
  if [[ -f "$venv/pyvenv.cfg" ]]; then
    rm -rf "$venv"
    say "removed the virtualenv $venv"
  elif [[ -e "$venv" ]]; then
    die "$venv does not look like a virtualenv (no pyvenv.cfg): not removed"
  fi
fi

if [[ $delete_data -eq 1 ]]; then
  if [[ -d "$data_dir" ]]; then
    rm -rf "$data_dir"
    say "removed Kestrel's data folder $data_dir (conversations, settings, the app's models folder)"
  fi
else
  say "kept Kestrel's data (conversations, settings, the app's models folder): $data_dir (--delete-data removes it)"
fi
say "models downloaded from the Hub stay in the shared Hugging Face cache: $hf_cache"
[[ $purge -eq 1 ]] || say "the virtualenv stays: $venv (--purge removes it)"
