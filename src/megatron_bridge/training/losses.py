"""Megatron-Bridge's ``megatron.bridge.training.losses``: the masked next-token loss with its keyword arguments.

The loss itself is :func:`megatron_bridge.models.loss.masked_next_token_loss` (the default forward step's); this
module adds Megatron-Bridge's signature: ``output_tensor`` may be ``(losses, loss_mask)`` (its LLaVA form), and
``check_for_nan_in_loss`` raises :class:`~megatron_bridge.errors.TrainingError` on a NaN loss of this micro-batch
(Megatron-Bridge's rerun state machine stops the run the same way). ``check_for_spiky_loss`` is refused: the loop
here stops on NaN/Inf losses and keeps no loss history to compare against.
"""

from functools import partial

import torch

from megatron_bridge.errors import MegatronBridgeError, TrainingError
from megatron_bridge.models.loss import masked_next_token_loss as _masked_loss


__all__ = ["create_masked_next_token_loss_function", "masked_next_token_loss"]


def masked_next_token_loss(
    loss_mask: torch.Tensor,
    output_tensor: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
    check_for_nan_in_loss: bool = True,
    check_for_spiky_loss: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """``(loss_sum, num_tokens, {"lm loss": [loss_sum, num_tokens]})`` of one micro-batch, as Megatron-Bridge's.

    Raises:
        TrainingError: ``check_for_nan_in_loss`` and the loss is NaN.
        MegatronBridgeError: ``check_for_spiky_loss=True`` (not supported here; pass False).
    """
    if check_for_spiky_loss:
        raise MegatronBridgeError("masked_next_token_loss(check_for_spiky_loss=True) is not supported: this library "
                                  "keeps no loss history to compare against (the loop stops on NaN/Inf losses); "
                                  "pass check_for_spiky_loss=False")
    if isinstance(output_tensor, tuple):
        output_tensor, loss_mask = output_tensor[0], output_tensor[1]
    loss_sum, num_tokens, report = _masked_loss(loss_mask, output_tensor)
    if check_for_nan_in_loss and torch.isnan(loss_sum).item():
        raise TrainingError("found NaN in local forward loss calculation (masked_next_token_loss); lower the "
                            "learning rate or check the data, or pass check_for_nan_in_loss=False")
    return loss_sum, num_tokens, report


def create_masked_next_token_loss_function(loss_mask: torch.Tensor, check_for_nan_in_loss: bool,
                                           check_for_spiky_loss: bool) -> partial:
    """``loss_func(output_tensor)`` for a forward step: :func:`masked_next_token_loss` bound to ``loss_mask``."""
    return partial(masked_next_token_loss, loss_mask, check_for_nan_in_loss=check_for_nan_in_loss,
                   check_for_spiky_loss=check_for_spiky_loss)
