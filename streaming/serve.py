"""``python -m streaming.serve``: the server app is ``apps/serve.py`` (``python -m apps.serve``); this hands over to
it."""

import runpy

if __name__ == "__main__":
    runpy.run_module("apps.serve", run_name="__main__", alter_sys=True)
