"""``python -m avatars``: the avatar app is ``apps/avatars.py`` (``python -m apps.avatars``); this hands over to it."""

import runpy

if __name__ == "__main__":
    runpy.run_module("apps.avatars", run_name="__main__", alter_sys=True)
