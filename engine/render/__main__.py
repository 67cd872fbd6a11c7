"""``python -m engine.render``: the render app is ``apps/render.py`` (``python -m apps.render``); this hands over to
it."""

import runpy

if __name__ == "__main__":
    runpy.run_module("apps.render", run_name="__main__", alter_sys=True)
