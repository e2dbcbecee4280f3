"""The vocabulary table (``modules/sublayers.py``): the flags' paths and ``Carry``'s fields are its
paths; every layer has each sublayer's attention and LayerNorm where the table says; every
per-sublayer parameter a backbone makes is declared on the layers, so that a search for its name
(``ffn_omega``) finds where it comes from."""

import pytest
import torch

from fairseq_realformer import options
from fairseq_realformer.modules.backbones import BACKBONES
from fairseq_realformer.modules.layers import Carry, _Backbone
from fairseq_realformer.modules.residual_attention import ResidualMultiheadAttention
from fairseq_realformer.modules.sublayers import PATHS, SUBLAYERS, counts_per_layer

from .helpers import make_dictionary, realformer

DICT = make_dictionary()


def test_paths_and_carry_come_from_the_table():
    assert PATHS == options.PATHS == ("encoder", "decoder", "cross")
    assert Carry._fields == (*PATHS, "stream")
    assert counts_per_layer() == "2 per encoder layer, 3 per decoder layer"


@pytest.mark.parametrize("paths", ["encoder", "decoder", "cross"])
def test_each_attention_sublayer_is_where_the_table_says_and_on_its_path(paths):
    model = realformer(paths, "mean", "admin", dictionary=DICT)
    for side, stack in (("encoder", model.encoder.layers), ("decoder", model.decoder.layers)):
        for layer in stack:
            for sublayer in SUBLAYERS[side]:
                assert isinstance(getattr(layer, sublayer.layer_norm), torch.nn.LayerNorm)
                if sublayer.path is not None:
                    on_path = isinstance(getattr(layer, sublayer.name), ResidualMultiheadAttention)
                    assert on_path == (sublayer.path == paths), (side, sublayer)


@pytest.mark.parametrize("backbone", [name for name, b in BACKBONES.items() if b.weight is not None])
def test_every_per_sublayer_parameter_is_declared_on_the_layers(backbone):
    model = realformer("all", "mean", backbone, dictionary=DICT)
    weight = BACKBONES[backbone].weight.name
    made = {name.rpartition(".")[2] for name, _ in model.named_parameters() if name.endswith(f"_{weight}")}
    assert made == {sublayer.parameter(weight) for side in SUBLAYERS.values() for sublayer in side}
    assert made <= set(_Backbone.__annotations__)
