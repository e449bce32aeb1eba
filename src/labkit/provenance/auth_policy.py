"""The team server's authorization function: MLflow's basic auth, plus "readers create nothing".

Why this exists: MLflow's basic-auth app gives every authenticated user ``default_permission``
(READ here) on what others made, and MANAGE on what they make themselves; with workspaces off
(labkit's server), *any* authenticated user may create an experiment. A reader could then
create an experiment of its own and log runs into it. labkit's three roles need one rule more:

    reader  no grant: READ on every experiment (MLflow's default), and no create of any kind
    editor  a grant of EDIT on experiment ``*``: logs runs in every experiment, MANAGE on the
            ones it creates (MLflow grants that to the creator), never deletes another's
    admin   MLflow's ``is_admin``: everything, user management included

The rule lives in ``authorization_function`` (``auth.ini``), the hook MLflow's app calls first
for every request (Flask routes and its FastAPI middleware alike): it authenticates as MLflow
does, then refuses (403) a request whose MLflow validator is one of the ``validate_can_create_*``
family when the user is neither an admin nor holds the editor grant. Everything else is MLflow's
own decision. Nothing here is imported by a client; only ``mlflow server`` workers load it.
"""

from __future__ import annotations

EDITOR_GRANT = ("experiment", "*", "EDIT")  # what `labkit team user add --role editor` grants


def _is_create(validator) -> bool:
    return getattr(validator, "__name__", "").startswith("validate_can_create")


def authenticate():
    """MLflow's basic auth; a non-editor's create request answers 403 Permission denied."""
    from flask import request
    from mlflow.server import auth
    from mlflow.server.auth.permissions import RESOURCE_TYPE_WORKSPACE
    from mlflow.server.auth.requirements import Requirement

    result = auth.authenticate_request_basic_auth()
    if not hasattr(result, "username"):  # a 401 response
        return result
    validator = auth._find_validator(request)
    if validator is None or not _is_create(validator):
        return result
    if auth.store.get_user(result.username).is_admin:
        return result
    kind, pattern, _ = EDITOR_GRANT
    if auth.authorize(result.username, (RESOURCE_TYPE_WORKSPACE, "*"), [Requirement(kind, pattern, "update")]):
        return result
    return auth.make_forbidden_response()
