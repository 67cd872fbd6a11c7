"""``python -m apps.render --service URL``: a clip rendered by a running ``apps.serve`` (its ``/renders`` jobs).

The audio is uploaded as it is (the service decodes and checks it), the job's progress shown as a bar from its
``GET /renders/{id}``, and the finished MP4 downloaded to ``--out``. Ctrl-C cancels the job on the service. Plain
HTTP from the standard library: no model, no torch.
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from tqdm import tqdm

FOLLOW_SECONDS = 0.5
"""How long each ``GET /renders/{id}?wait=`` may wait: the bar's refresh; the job's end is answered at once."""


class ServiceRefused(Exception):
    """The service answered with an error: its status and its message."""


def call(method: str, url: str, token: str | None, data: bytes | None = None, json_body: Any = None) -> Any:
    """One request; the answer's JSON (or the response itself for a download); ServiceRefused with its error."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if json_body is not None:
        data, headers["Content-Type"] = json.dumps(json_body).encode(), "application/json"
    elif data is not None:
        headers["Content-Type"] = "application/octet-stream"
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        response = urllib.request.urlopen(request, timeout=60)
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read())["error"]
        except (ValueError, KeyError):
            message = exc.reason
        raise ServiceRefused(f"{method} {urllib.parse.urlsplit(url).path}: {exc.code} {message}") from None
    except urllib.error.URLError as exc:
        raise ServiceRefused(f"cannot reach the service at {url}: {exc.reason}") from None
    if response.headers.get_content_type() == "application/json":
        with response:
            return json.loads(response.read())
    return response


def render_on_service(
    service: str,
    avatar: str,
    audio: Path,
    out: Path,
    token: str | None = None,
    seed: int = 0,
    overlap: int | None = None,
    controls: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Submit ``audio`` as a job for ``avatar``, follow it and write its MP4 to ``out``; the job's final record."""
    query = {"avatar": avatar, "seed": seed}
    if overlap is not None:
        query["overlap"] = overlap
    if controls:
        query["controls"] = json.dumps(controls)
    base = service.rstrip("/")
    job = call("POST", f"{base}/renders?{urllib.parse.urlencode(query)}", token, data=audio.read_bytes())
    try:
        job = follow(job, token)
    except KeyboardInterrupt:
        call("DELETE", job["urls"]["self"], token)
        print(f"render {job['id']} cancelled on the service", file=sys.stderr)
        raise
    if job["state"] != "done":
        raise ServiceRefused(f"render {job['id']} {job['state']}: {job['error']}")
    out.parent.mkdir(parents=True, exist_ok=True)
    with call("GET", job["urls"]["video"], token) as response, open(out, "wb") as file:
        while chunk := response.read(1 << 20):
            file.write(chunk)
    call("DELETE", job["urls"]["self"], token)  # the service keeps no copy once it is here
    return job


def follow(job: dict[str, Any], token: str | None) -> dict[str, Any]:
    """Follow the job until it ends, its frames on a progress bar (its position in the queue while it waits); each
    request waits on the service until the job ends or ``FOLLOW_SECONDS`` pass, so the end is seen when it comes."""
    with tqdm(total=job["frames_total"], unit="frame", desc="rendering on the service") as bar:
        while job["state"] in ("queued", "running", "cancelling"):
            if job["state"] == "queued":
                bar.set_postfix_str("queued", refresh=True)
            bar.update(job["frames_done"] - bar.n)
            job = call("GET", f"{job['urls']['self']}?wait={FOLLOW_SECONDS}", token)
        bar.update(job["frames_done"] - bar.n)
    return job
