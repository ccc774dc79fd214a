"""Tests for tta_gating.py's gate swap on hand-set agents whose gate does or does not carry the force sign to the
policy: the swap effect is large when the policy reads the sign from the gate, exactly zero when it ignores the gate, and
the learned gate's routing reads the sign split and the held-out mode's slot."""

from typing import NamedTuple

import numpy as np
import pytest
import torch

import cleanrl_astral.ppo_gru_astral as ppo_gru_astral
import cleanrl_astral.tta_gating as tta_gating
from cleanrl_astral_utils import tta
from cleanrl_astral_utils.cartpole import KINDS

MIRROR4_SIGNS = [1.0, -1.0, 1.0, -1.0, -1.0]  # mode 4 is held out


def toy_agent(policy_reads_gate, gate_reads_sign=True):
    """A hand-set oracle agent on mirror4 whose hidden state holds (the pole's lean, the mode's force sign). Its gate puts
    the sign's modes on slot 0 (force +1) or slot 1 (force -1), z = w0 - w1 = the sign; its actor pushes towards the lean,
    times z when `policy_reads_gate` (balancing every mode with the learned gate), else times 1 (the gate never reaches the
    actor: only force +1 balances, whatever the gate). `gate_reads_sign=False` makes the gate uniform."""
    agent = tta_gating.Agent(ppo_gru_astral.Args(hidden_size=4, oracle=True, num_abstractions=2, slot_dim=1), 4, 2, 5)
    with torch.no_grad():
        for param in agent.parameters():
            param.zero_()
        # input: x, x_dot, theta, theta_dot, previous action (2), previous reward, mode one-hot (5)
        agent.encoder[0].weight[0, 2] = 1.0
        agent.encoder[0].weight[0, 3] = 0.5
        agent.encoder[0].weight[1, 7:] = 3.0 * torch.tensor(MIRROR4_SIGNS)
        # GRU: update gate shut (h = n), n = tanh(features): h0 follows the lean, h1 the sign
        agent.gru.bias_ih[4:8] = -30.0
        agent.gru.weight_ih[8:12] = torch.eye(4)
        if gate_reads_sign:
            agent.bank.gate[0].weight[0, 1] = 1.0
            agent.bank.gate[2].weight[0, 0] = 20.0
            agent.bank.gate[2].weight[1, 0] = -20.0
        agent.bank.slots[0, 0] = 1.0
        agent.bank.slots[1, 0] = -1.0
        if policy_reads_gate:
            agent.film.net.weight[0, 0] = 1.0  # γ0 = 1 + (z - 1) = z
            agent.film.net.bias[0] = -1.0
        agent.actor[0].weight[0, 0] = 1.0
        agent.actor[2].weight[0, 0] = -10.0
        agent.actor[2].weight[1, 0] = 10.0
    return agent.eval()


def mirror4_targets():
    ckpt = {"modes": ppo_gru_astral.MODE_PRESETS["mirror4"], "args": {"oracle": True, "modes_preset": "mirror4"}}
    return tta_gating.resolve_targets(None, None, ckpt)


class ShortCartPole(tta_gating.NonStationaryCartPole):
    """Episodes of at most 100 steps: what separates balancing from falling (~10 steps), at a fifth of the cost."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.max_episode_steps = 100


class ToySwap(NamedTuple):
    swap: tta_gating.Swap
    matrix: dict
    """{kind: target × column mean returns}"""
    report: dict
    """swap.json's fields"""


def swap_of(agent, episodes=3):
    targets = mirror4_targets()
    swap = tta_gating.gate_swap(agent, targets, False, episodes, 1)
    report = {"columns": [*swap.gates, "learned"], "routing": tta.gate_routing(swap.episode_gates, swap.mean_gates, targets)}
    report["results"] = {target["name"]: tta_gating.cells(swap.runs[target["name"]]) for target in targets}
    tta.add_swap_analysis(report, targets)
    return ToySwap(swap, {kind: np.asarray(m) for kind, m in report["matrix"].items()}, report)


@pytest.fixture(scope="module")
def toy_swaps():
    """swap_of the three toy agents: the policy reads the gate, ignores it, and the gate is uniform."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tta_gating, "NonStationaryCartPole", ShortCartPole)
        return {
            "reads_gate": swap_of(toy_agent(policy_reads_gate=True)),
            "ignores_gate": swap_of(toy_agent(policy_reads_gate=False)),
            "uniform_gate": swap_of(toy_agent(policy_reads_gate=True, gate_reads_sign=False)),
        }


def test_swap_effect_is_large_when_the_policy_reads_the_sign_from_the_gate(toy_swaps):
    """The gate carries the sign and the actor reads it: with the learned gate every mode balances; with either sign's
    mean gate only that sign's modes do. If this failed, the swap fixed the wrong gate or compared the wrong columns."""
    toy = toy_swaps["reads_gate"]
    assert toy.report["columns"] == ["sign+1", "sign-1", "mode0", "mode1", "mode2", "mode3", "learned"]
    assert torch.allclose(toy.swap.gates["sign+1"], torch.tensor([1.0, 0.0]), atol=1e-4)
    assert torch.allclose(toy.swap.gates["sign-1"], torch.tensor([0.0, 1.0]), atol=1e-4)
    returns = toy.matrix["deterministic"]
    learned = returns[:, -1]
    own = np.array([returns[i, 0 if s > 0 else 1] for i, s in enumerate(MIRROR4_SIGNS)])
    other = np.array([returns[i, 1 if s > 0 else 0] for i, s in enumerate(MIRROR4_SIGNS)])
    assert (learned > 60).all()
    assert np.array_equal(own, learned)
    assert (other < 30).all()
    for kind in KINDS:
        assert toy.report["swap_effect"][kind]["sign"]["value"] > 40
        assert toy.report["swap_effect"][kind]["mode"]["value"] > 15


def test_swap_effect_is_zero_when_the_policy_ignores_the_gate(toy_swaps):
    """The same gate, but the actor never reads z: every column is the same episodes, the effect exactly 0, although the
    gate still reads the sign (episode NMI against the sign 1). If this failed, the swap measured something besides z."""
    toy = toy_swaps["ignores_gate"]
    for kind in KINDS:
        assert toy.report["swap_effect"][kind]["sign"]["value"] == 0.0
        assert toy.report["swap_effect"][kind]["mode"]["value"] == 0.0
    assert (toy.matrix["deterministic"][[0, 2]] > 60).all()
    assert (toy.matrix["deterministic"][[1, 3, 4]] < 30).all()
    assert toy.report["routing"]["episode_nmi_sign"] == pytest.approx(1.0)


def test_gate_routing_reads_the_sign_split_and_the_held_out_modes_slot(toy_swaps):
    """A gate that splits episodes exactly by sign scores episode NMI 1 against the sign and exactly log 2 / log 4 = 0.5
    against four equally played modes; the held-out force -1 mode goes to the force -1 slot. A uniform gate scores 0
    and has no sign slot to route to."""
    routing = toy_swaps["reads_gate"].report["routing"]
    assert routing["episode_nmi_sign"] == pytest.approx(1.0)
    assert routing["episode_nmi_mode"] == pytest.approx(0.5)
    assert routing["episodes"] == 12
    assert routing["sign_split"]
    assert routing["signs_on_disjoint_slots"]
    assert routing["slot_of_mode"] == {"mode0": 0, "mode1": 1, "mode2": 0, "mode3": 1, "mode4": 1}
    assert routing["held_out"]["mode4"] == {
        "sign": -1.0,
        "slot": 1,
        "sign_slots": [1],
        "to_sign_slot": True,
        "episode_share_on_sign_slots": 1.0,
    }
    uniform = toy_swaps["uniform_gate"].report["routing"]
    assert uniform["episode_nmi_sign"] == 0.0
    assert uniform["episode_nmi_mode"] == 0.0
    assert not uniform["sign_split"]
    assert not uniform["signs_on_disjoint_slots"]
    assert uniform["held_out"]["mode4"]["to_sign_slot"] is None
