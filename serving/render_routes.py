"""The render jobs' HTTP routes (``serving.renders``), added to the service's application when it takes jobs.

    POST   /renders?avatar=NAME[&overlap=10&seed=0&controls={...}]   body: the audio (WAV, FLAC, MP3, Ogg Opus)
    POST   /renders   {"avatar": NAME, "audio_file": NAME, "overlap": 10, "seed": 0, "controls": {...}}
                      (a file of the operator's --render-audio folder)          -> 202 {"id": ..., "state": "queued"}
    GET    /renders           -> {"renders": [...], "queue": {...}}
    GET    /renders/{id}[?wait=S] -> state, frames done / total, audio seconds rendered, frames per second, time left,
                                 events; with ``wait``, answered once the job ends or after S seconds (at most
                                 MAX_WAIT), whichever comes first: a client following it learns the end at once
    GET    /renders/{id}/video -> the finished MP4 (409 before it is done)
    DELETE /renders/{id}      -> cancels it (or forgets it once done) and removes its file

A body over the size bound is refused from its Content-Length (413) before it is read; audio over the duration bound
while it is decoded (413); anything but audio of those formats is a 415; every refusal leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from pathlib import Path
from typing import Any

from aiohttp import web

from engine.controls import ControlError, check_changes
from serving.api import ErrorKind, RenderState, SessionError
from serving.protocol import DescribeAvatar
from serving.render_audio import AudioRefused, decode_clip
from serving.renders import RenderJob, RenderLimits, RenderSpec
from serving.service import Service
from serving.sessions import parse_body

OPTIONS = ("avatar", "overlap", "seed", "controls")
MAX_WAIT = 30.0
"""The longest a ``GET /renders/{id}?wait=`` holds its answer."""
JSON_FIELDS = (*OPTIONS, "audio_file")


def add_render_routes(app: web.Application, service: Service) -> None:
    """``/renders`` on ``app``, over ``service``'s jobs; a refusal is a ``SessionError``, which the app's middleware
    answers (``serving.http``)."""
    renders = service.renders
    limits = renders.limits

    def described(request: web.Request, job: RenderJob) -> dict[str, Any]:
        base = f"{request.scheme}://{request.host}/renders/{job.id}"
        return {**job.describe(), "urls": {"self": base, "video": f"{base}/video"}}

    async def submit(request: web.Request) -> web.Response:
        if service.refusing is not None:  # a cluster replica draining for removal: another one takes the job
            raise SessionError(service.refusing, ErrorKind.ADMISSION)
        try:
            if request.content_type == "application/json":
                values = parse_body(await request.text())
                if not isinstance(values, dict):
                    raise SessionError(
                        'POST /renders takes a JSON object, e.g. {"avatar": "anchor", ...}', ErrorKind.INVALID
                    )
                unknown = set(values) - set(JSON_FIELDS)
                if unknown:
                    raise SessionError(
                        f"unknown field(s) {sorted(unknown)}; known: {', '.join(JSON_FIELDS)}", ErrorKind.INVALID
                    )
                data = read_audio_file(values.get("audio_file"), limits)
            else:
                values = query_options(request.query)
                data = await read_body(request, limits)
            options = check_options(values)
            await service.core.request(DescribeAvatar(options["avatar"]))
            pcm = await asyncio.to_thread(decode_clip, data, limits.max_seconds)
            job = renders.submit(RenderSpec(pcm=pcm, **options))
        except AudioRefused as exc:
            raise SessionError(str(exc), ErrorKind.of_status(exc.status)) from exc
        return web.json_response(described(request, job), status=202)

    async def listing(request: web.Request) -> web.Response:
        jobs = [described(request, j) for j in renders.jobs.values()]
        queue = {"limit": limits.queue, **renders.counts()}
        return web.json_response({"renders": jobs, "queue": queue})

    def job_of(request: web.Request) -> RenderJob:
        return renders.get(request.match_info["id"])

    async def one(request: web.Request) -> web.Response:
        job = job_of(request)
        wait = wait_seconds(request.query.get("wait"))
        if wait and not job.state.ended:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(job.finished.wait(), wait)
        return web.json_response(described(request, job))

    async def video(request: web.Request) -> web.StreamResponse:
        job = job_of(request)
        if job.state != RenderState.DONE:
            raise SessionError(
                f"render {job.id} is {job.state}: its video is served once it is done", ErrorKind.NOT_READY
            )
        response = web.FileResponse(job.path, headers={"Content-Type": "video/mp4"})
        response.headers["Content-Disposition"] = f'attachment; filename="{job.path.name}"'
        return response

    async def cancel(request: web.Request) -> web.Response:
        job = job_of(request)
        job = await renders.cancel(job.id)
        return web.json_response(described(request, job))

    app.router.add_post("/renders", submit)
    app.router.add_get("/renders", listing)
    app.router.add_get("/renders/{id}", one)
    app.router.add_get("/renders/{id}/video", video)
    app.router.add_delete("/renders/{id}", cancel)


def wait_seconds(value: str | None) -> float:
    """The ``wait`` of a ``GET /renders/{id}``: seconds in [0, MAX_WAIT] (0 when absent)."""
    if value is None:
        return 0.0
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not 0 <= seconds <= MAX_WAIT:
        raise SessionError(f"wait must be seconds from 0 to {MAX_WAIT:g}, got {value!r}", ErrorKind.INVALID)
    return seconds


def query_options(query: Any) -> dict[str, Any]:
    """The motion options of an upload, from its query string (``controls`` as JSON)."""
    unknown = set(query) - set(OPTIONS) - {"token"}
    if unknown:
        raise SessionError(f"unknown option(s) {sorted(unknown)}; known: {', '.join(OPTIONS)}", ErrorKind.INVALID)
    values: dict[str, Any] = {k: query[k] for k in OPTIONS if k in query}
    for key in ("overlap", "seed"):
        if key in values:
            try:
                values[key] = int(values[key])
            except ValueError:
                raise SessionError(f'"{key}" is an integer, got {values[key]!r}', ErrorKind.INVALID) from None
    if "controls" in values:
        try:
            values["controls"] = json.loads(values["controls"])
        except json.JSONDecodeError as exc:
            raise SessionError(f'"controls" is a JSON object: {exc}', ErrorKind.INVALID) from None
    return values


def check_options(values: dict[str, Any]) -> dict[str, Any]:
    """avatar, overlap, seed, controls checked as a session's are; SessionError(invalid) naming the field."""
    avatar = values.get("avatar")
    if not isinstance(avatar, str) or not avatar:
        raise SessionError('a render names its "avatar"', ErrorKind.INVALID)
    overlap, seed = values.get("overlap"), values.get("seed", 0)
    for key, value, low, high in (("overlap", overlap, 0, 79), ("seed", seed, 0, 2**31 - 1)):
        if value is not None and (type(value) is not int or not low <= value <= high):
            raise SessionError(f'"{key}" is an integer from {low} to {high}, got {value!r}', ErrorKind.INVALID)
    try:
        controls = check_changes(values["controls"]) if values.get("controls") is not None else None
    except ControlError as exc:
        raise SessionError(f'"controls": {exc}', ErrorKind.INVALID) from None
    return {"avatar": avatar, "overlap": overlap, "seed": seed, "controls": controls}


async def read_body(request: web.Request, limits: RenderLimits) -> bytes:
    """The uploaded audio, at most ``max_mb`` (refused from its Content-Length, or once it reads past it)."""
    limit = int(limits.max_mb * 1024 * 1024)
    too_big = f"the upload is over this service's {limits.max_mb:g} MB"
    if request.content_length is not None and request.content_length > limit:
        raise SessionError(too_big, ErrorKind.TOO_LARGE)
    parts, size = [], 0
    async for chunk in request.content.iter_chunked(1 << 16):
        size += len(chunk)
        if size > limit:
            raise SessionError(too_big, ErrorKind.TOO_LARGE)
        parts.append(chunk)
    if not size:
        raise SessionError(
            "POST /renders takes the audio as its body (or JSON naming an audio_file of the service's folder)",
            ErrorKind.INVALID,
        )
    return b"".join(parts)


def read_audio_file(name: Any, limits: RenderLimits) -> bytes:
    """A file of the operator's audio folder by its plain name; nothing outside the folder is ever opened."""
    folder = limits.audio_folder
    if folder is None:
        raise SessionError(
            "this service takes no audio_file (start it with --render-audio DIR); upload the audio", ErrorKind.INVALID
        )
    if not isinstance(name, str) or not name or "/" in name or "\\" in name or name.startswith("."):
        raise SessionError('"audio_file" is the plain name of a file in the service\'s audio folder', ErrorKind.INVALID)
    path = folder / name
    try:
        inside = path.resolve(strict=True).parent == folder.resolve()
    except (OSError, RuntimeError):
        inside = False
    if not inside or not path.is_file():
        raise SessionError(f"no audio file {name!r} in the service's audio folder", ErrorKind.NOT_FOUND)
    if path.stat().st_size > limits.max_mb * 1024 * 1024:
        raise SessionError(f"{name} is over this service's {limits.max_mb:g} MB", ErrorKind.TOO_LARGE)
    return Path(path).read_bytes()
