"""The command-line apps, a layer above the libraries: ``python -m apps.render`` (a file), ``python -m apps.serve``
(the live service; ``--ray`` for a cluster) and ``python -m apps.avatars`` (register and inspect avatars).

They parse arguments and set the process up; what they run lives in engine/, streaming/, avatars/ and cluster/,
none of which imports this package.
"""
