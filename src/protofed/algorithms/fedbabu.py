"""FedBABU (Oh, Kim & Yun, ICLR 2022): train and share only the body; fine-tune to personalize.

J. Oh, S. Kim, S.-Y. Yun. FedBABU: Toward Enhanced Representation for Federated Image
Classification. ICLR 2022.

During federated training the head (the last linear classifier) keeps its random initial
weights on every client and is never updated; clients train only the body, and the server
averages the bodies by sample count. With one fixed head shared by all, local updates cannot
pull client heads apart, and the body has to carry the representation. To personalize, each
client fine-tunes the global model on its own training data for `finetune_epochs` (tau_f = 5 in
the paper, with the training learning rate). The global model is the averaged body with the
fixed head.

Decisions:
- What is fine-tuned, `finetune`: "full" (default: body and head together, the fine-tuning of
  the paper's personalization experiments) or "head" (the head alone, body frozen, the variant
  the abstract describes), or "body".
- Where fine-tuning runs: it needs the client's data, which the evaluation does not have, so it
  runs in `fit`. Every round a client trains, it also fine-tunes the model it received (the
  global model of the previous round), on its training split with its seeded generator, and
  keeps the result as its state (record `"personal"`): the personalized model is "what fine-tuning would give if
  training stopped now", deterministic given the seed, at the cost of `finetune_epochs` more
  epochs per client and round (the paper fine-tunes once, at evaluation time). A client that
  never trained is evaluated with the global model. `finetune_epochs=0` skips it.
- Only the body is sent and received (the head never changes, so every client holds the
  initial one); BatchNorm statistics of the body travel with the body.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from protofed.algorithms.base import Algorithm, Hyperparams
from protofed.algorithms.common.split import body_parameters, head_parameters, split_arrays
from protofed.core.types import MODEL, Arrays, Client, FitResult, Records

PERSONAL = "personal"  # client state: the fine-tuned model


class FedBABU(Algorithm):
    name = "fedbabu"
    summary = "Head fixed at init, body trained and averaged; personalize by fine-tuning."
    reference = "Oh, Kim & Yun, FedBABU: Toward Enhanced Representation for Federated Image Classification, ICLR 2022"

    class Params(Hyperparams):
        finetune_epochs: int = Field(
            5, ge=0, description="Fine-tuning epochs of the personalized model (paper tau_f: 5)."
        )
        finetune: Literal["full", "head", "body"] = Field(
            "full",
            description="What fine-tuning trains: 'full' (paper's experiments), 'head' or 'body'.",
        )

    params: Params

    def fixed_head(self) -> Arrays:
        """The head every client uses during federated training: the initial one."""
        return split_arrays(self.setting.init_model)[1]

    def init_server(self) -> Records:
        return {MODEL: dict(split_arrays(self.setting.init_model)[0])}

    def fit(self, client: Client, message: Records, state: Records) -> FitResult:
        model = client.model
        head = self.fixed_head()
        client.load(message[MODEL])
        client.load(head)
        metrics = client.train_model(parameters=body_parameters(model))
        body, _ = split_arrays(client.weights())
        kept: Records = {}
        if self.params.finetune_epochs > 0:
            client.load(message[MODEL])
            client.load(head)
            part = self.params.finetune
            parameters = (
                None
                if part == "full"
                else (head_parameters(model) if part == "head" else body_parameters(model))
            )
            tuned = client.train_model(epochs=self.params.finetune_epochs, parameters=parameters)
            metrics["finetune_loss"] = tuned["loss"]
            kept = {PERSONAL: client.weights()}
        return FitResult({MODEL: body}, metrics, kept)

    def client_model(self, message: Records, state: Records) -> Arrays:
        return state[PERSONAL] if PERSONAL in state else {**message[MODEL], **self.fixed_head()}

    def global_model(self, server: Records) -> Arrays:
        return {**server[MODEL], **self.fixed_head()}
