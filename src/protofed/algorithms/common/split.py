"""Body shared, head local: the mechanics of FedPer, FedRep (and FedBABU, FedRoD).

Every `FedModel` names its tensors `features.*` (the body, or representation) and `head.*`
(the classifier). Methods that personalize the head send and average only the body (as their
`"model"` record) and keep each client's head in its state (the record `"head"`). The split
is by the first name component, for parameters and buffers alike (a BatchNorm's running
statistics go with the part their module belongs to); anything not under `head.` counts as
body, so nothing is silently dropped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from torch import nn

from protofed.algorithms.base import MODEL, Algorithm, Arrays, Client, Records

HEAD = "head"  # the classifier's module name, and the client-state record of a local head


def is_head(name: str) -> bool:
    """Whether a parameter or buffer name belongs to the classifier head."""
    return name.split(".", 1)[0] == HEAD


def _names(source: nn.Module | Mapping[str, object] | Iterable[str]) -> list[str]:
    if isinstance(source, nn.Module):
        return list(source.state_dict().keys())
    return list(source)


def head_names(source: nn.Module | Mapping[str, object] | Iterable[str]) -> list[str]:
    """Head names (parameters and buffers) of a model, of a mapping of arrays, or of names."""
    return [n for n in _names(source) if is_head(n)]


def body_names(source: nn.Module | Mapping[str, object] | Iterable[str]) -> list[str]:
    """Body names (everything that is not the head), in the source's order."""
    return [n for n in _names(source) if not is_head(n)]


def split_arrays(arrays: Arrays) -> tuple[Arrays, Arrays]:
    """(body, head) of a flat mapping of arrays; the tensors are shared, not copied."""
    body: Arrays = {}
    head: Arrays = {}
    for name, tensor in arrays.items():
        (head if is_head(name) else body)[name] = tensor
    return body, head


def head_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The head's trainable tensors, for `Client.train_model(parameters=...)`."""
    return [p for n, p in model.named_parameters() if is_head(n)]


def body_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The body's trainable tensors, for `Client.train_model(parameters=...)`."""
    return [p for n, p in model.named_parameters() if not is_head(n)]


class HeadLocalAlgorithm(Algorithm):
    """Base for methods whose server holds only the body and whose clients keep their heads.

    The server state, every message and every reply hold the body as their `"model"` record
    (the replies' bodies are averaged by sample count, the default `aggregate`); the client
    state holds the client's head as the record `"head"` (the initial head before its first
    round). The personalized model is the received body plus the client's head. There is no
    global model: a body without a head cannot classify. Subclasses write `fit` with `start`
    (load body + head into the workspace) and `finish` (the reply and the state to keep).
    """

    has_global_model = False

    def init_server(self) -> Records:
        body, _ = split_arrays(self.setting.init_model)
        return {MODEL: dict(body)}

    def local_head(self, state: Records) -> Arrays:
        """The client's head: from its state, or the initial head if it never trained."""
        if HEAD in state:
            return state[HEAD]
        _, head = split_arrays(self.setting.init_model)
        return head

    def start(self, client: Client, message: Records, state: Records) -> None:
        """Load the received body and the client's own head into the workspace model."""
        client.load(message[MODEL])
        client.load(self.local_head(state))

    def finish(self, client: Client) -> tuple[Records, Records]:
        """(reply: the body, state: the head), copied out of the workspace model."""
        body, head = split_arrays(client.weights())
        return {MODEL: body}, {HEAD: head}

    def client_model(self, message: Records, state: Records) -> Arrays:
        return {**message[MODEL], **self.local_head(state)}
