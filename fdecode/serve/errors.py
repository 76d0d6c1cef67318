"""OpenAI-style errors: `{"error": {"message", "type", "param", "code"}}` with a 4xx or 5xx status.

`APIError` is raised anywhere a request is refused (bad body, unknown model, too long a prompt, a
grammar the compiler refuses, a full queue); the app turns it, and pydantic's validation errors, into
the body the official clients parse (`openai.BadRequestError` and friends). A refusal never reaches the
Engine, so it cannot disturb other requests.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastapi.responses import JSONResponse

TYPES = {400: "invalid_request_error", 404: "not_found_error", 429: "rate_limit_error", 503: "service_unavailable"}


@dataclass
class APIError(Exception):
    status: int
    message: str
    param: str | None = None
    code: str | None = None

    def body(self) -> dict:
        kind = TYPES.get(self.status, "server_error" if self.status >= 500 else "invalid_request_error")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)

    def __str__(self) -> str:
        return f"{self.status}: {self.message}"


def validation_error(errors: list[dict]) -> APIError:
    """pydantic's errors (FastAPI's RequestValidationError) as one 400, naming the first field at fault."""
    first = errors[0] if errors else {"msg": "invalid request", "loc": ()}
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    if first.get("type") == "json_invalid":
        return APIError(400, f"the body is not valid JSON: {first.get('ctx', {}).get('error', first['msg'])}")
    if first.get("type") == "extra_forbidden":
        return APIError(400, f"unsupported parameter {'.'.join(loc)!r}", param=".".join(loc), code="unsupported")
    if first.get("type") == "missing" and not loc:
        return APIError(400, "the body must be a JSON object")
    where = ".".join(loc) or "body"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return APIError(400, f"{where}: {first['msg']}{more}", param=where)
