"""WHEP egress (the IETF WebRTC-HTTP egress protocol): any WHEP player watches a session's preview with one POST.

    POST   /whep/{session}           body: the player's SDP offer (Content-Type: application/sdp)
                                     -> 201, body: the SDP answer, Location: /whep/{session}/{viewer}
    DELETE /whep/{session}/{viewer}  -> 200: that viewer's connection is closed

The offer is answered whole (no trickle ICE: the player gathers its candidates before it posts,
as the preview page does; PATCH is not served). A full preview is a 503, an offer that cannot be
answered a 400, a body of another type a 415. The server's token and Host/Origin rules apply as
on every other route (``serving.access``): ``Authorization: Bearer TOKEN``, which WHEP players send.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from streaming.sinks.webrtc import ViewerRefused, WebRtcPreview

SDP = "application/sdp"


def add_whep_routes(app: web.Application, preview_for: Callable[[str], WebRtcPreview]) -> None:
    """Serve WHEP on ``app``; ``preview_for(name)`` is the named session's preview (or raises an HTTP 404)."""

    async def offer(request: web.Request) -> web.Response:
        name = request.match_info["session"]
        preview = preview_for(name)
        if request.content_type != SDP:
            raise web.HTTPUnsupportedMediaType(
                text=f"POST the SDP offer as {SDP}, not {request.content_type or 'no type'}"
            )
        try:
            viewer, answer = await preview.join(await request.text())
        except ViewerRefused as exc:
            raise web.HTTPServiceUnavailable(text=str(exc)) from exc
        except ValueError as exc:
            raise web.HTTPBadRequest(text=str(exc)) from exc
        return web.Response(status=201, text=answer, content_type=SDP, headers={"Location": f"/whep/{name}/{viewer}"})

    async def leave(request: web.Request) -> web.Response:
        preview = preview_for(request.match_info["session"])
        if not await preview.leave(request.match_info["viewer"]):
            raise web.HTTPNotFound(text="no such viewer (it has left already, or never connected in time)")
        return web.Response(text="")

    app.router.add_post("/whep/{session}", offer)
    app.router.add_delete("/whep/{session}/{viewer}", leave)
