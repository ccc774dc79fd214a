"""The plan's design (--design plan) of ppo_gru_astral.py and ppo_gru_baseline.py: its network, where FiLM's gamma and beta
enter, its Config as the defaults, and the script's recurrent replay kept under it."""

import sys

import numpy as np
import pytest
import torch
import torch.nn as nn
from helpers import only_run_dir, run_script
from ppo_gru_main import run_main, update

import cleanrl_astral.ppo_gru_astral as ppo_gru_astral
import cleanrl_astral.ppo_gru_baseline as ppo_gru_baseline

D = 64  # the plan's d_model


def plan_reference(input_dim, num_actions, num_abstractions, with_bank):
    """The plan's modules (astral_plan.txt, models), built in the order its ASTRALAgent builds them, PyTorch's default
    initialisation: the state dict a plan-design Agent must equal when built from the same seed."""
    modules = {
        "encoder.0": nn.Linear(input_dim, D),
        "gru": nn.GRUCell(D, D),
    }
    if with_bank:
        modules["bank.slots"] = torch.randn(num_abstractions, D) * 0.02
        modules["bank.gate.0"] = nn.Linear(D, D)
        modules["bank.gate.2"] = nn.Linear(D, num_abstractions)
        modules["film.net.0"] = nn.Linear(D, D)
        modules["film.net.2"] = nn.Linear(D, 2 * D)
    modules["actor.0"] = nn.Linear(D, D)
    modules["actor.2"] = nn.Linear(D, num_actions)
    modules["critic.0"] = nn.Linear(D, D)
    modules["critic.2"] = nn.Linear(D, 1)
    state = {}
    for name, module in modules.items():
        if isinstance(module, torch.Tensor):
            state[name] = module
        else:
            for key, value in module.state_dict().items():
                state[f"{name}.{key}"] = value
    return state


@pytest.mark.parametrize("module,with_bank", [(ppo_gru_astral, True), (ppo_gru_baseline, False)])
def test_the_plan_design_is_the_plans_network_with_default_initialisation(module, with_bank):
    """Layer for layer the plan's: Linear(7, d)-ReLU encoder, GRUCell(d, d), gate Linear(d, d)-ReLU-Linear(d, K), slots
    K x d, FiLM Linear(d, d)-ReLU-Linear(d, 2d), heads Linear(d, d)-ReLU-Linear(d, out); every parameter as PyTorch
    initialises it (no orthogonal init, no zero GRU bias, no small gate or policy layer). The baseline is the same
    network without the bank and FiLM."""
    args = module.Args(design="plan", **module.PLAN_CONFIG)
    torch.manual_seed(3)
    agent = module.agent_from_args(args, 3)
    torch.manual_seed(3)
    expected = plan_reference(7, 2, 3, with_bank)
    state = agent.state_dict()
    assert list(state) == list(expected)
    for name, value in expected.items():
        assert torch.equal(state[name], value), name
    activations = [type(agent.encoder[1]), type(agent.actor[1]), type(agent.critic[1])]
    if with_bank:
        activations += [type(agent.bank.gate[1]), type(agent.film.net[1])]
    assert activations == [nn.ReLU] * len(activations)
    # the script's design differs where the plan's is tested above: tanh layers, orthogonal init, zero GRU biases
    torch.manual_seed(3)
    script = module.agent_from_args(module.Args(), 3)
    assert isinstance(script.encoder[1], nn.Tanh) and script.gru.bias_hh.abs().max() == 0


def test_plan_film_is_gamma_times_h_plus_beta_without_an_identity():
    """The plan's FiLM: (gamma, beta) = chunk of its MLP's output, gamma the first half, h' = gamma * h + beta; nothing
    is added to gamma, so a zero gamma removes h. The script's FiLM adds 1 to gamma (identity at a zero z)."""
    torch.manual_seed(0)
    film = ppo_gru_astral.PlanFiLM(8, 5)
    assert [type(layer) for layer in film.net] == [nn.Linear, nn.ReLU, nn.Linear]
    assert film.net[0].weight.shape == (5, 8) and film.net[2].weight.shape == (10, 5)
    h = torch.randn(4, 5)
    z = torch.randn(4, 8)
    gamma, beta = film.net(z).chunk(2, dim=-1)
    torch.testing.assert_close(film(h, z), gamma * h + beta, rtol=0, atol=0)
    with torch.no_grad():
        film.net[2].weight.zero_()
        film.net[2].bias.copy_(torch.cat([torch.full((5,), 2.0), torch.full((5,), 3.0)]))
    torch.testing.assert_close(film(h, z), 2.0 * h + 3.0)
    with torch.no_grad():
        film.net[2].bias[:5] = 0.0
    torch.testing.assert_close(film(h, z), torch.full((4, 5), 3.0))
    script = ppo_gru_astral.FiLM(8, 5)
    with torch.no_grad():
        script.net.weight.zero_()
        script.net.bias.zero_()
    torch.testing.assert_close(script(h, z), h)


@pytest.mark.parametrize("module", [ppo_gru_astral, ppo_gru_baseline])
def test_design_plan_makes_the_plans_config_the_defaults(module, monkeypatch):
    """--design plan: d_model 64, 8 envs x 128 steps, lr 3e-4 with Adam's default eps, minibatches of 256 steps, 4
    epochs, 500k steps, no lr annealing, reward normalisation or value clipping; K = 3, tau 1 and the lambdas as
    written; the plan's gate-entropy sign. A flag given beside it still wins, and the script's design keeps its own."""
    monkeypatch.setattr(sys, "argv", ["prog", "--design", "plan"])
    args = module.parse_args()
    batch_size = args.num_envs * args.num_steps
    plan = {
        "design": "plan",
        "hidden_size": 64,
        "num_envs": 8,
        "num_steps": 128,
        "learning_rate": 3e-4,
        "adam_eps": 1e-8,
        "update_epochs": 4,
        "total_timesteps": 500000,
        "anneal_lr": False,
        "norm_reward": False,
        "clip_vloss": False,
        "norm_adv": True,
        "gamma": 0.99,
        "gae_lambda": 0.95,
        "clip_coef": 0.2,
        "ent_coef": 0.01,
        "vf_coef": 0.5,
        "max_grad_norm": 0.5,
        "target_kl": None,
    }
    if module is ppo_gru_astral:
        plan.update(
            num_abstractions=3,
            slot_dim=64,
            tau=1.0,
            lambda_w_ent=0.001,
            lambda_lb=0.001,
            lambda_orth=0.0001,
            sharpen_gate=False,
            slot_init="random",
        )
    assert {name: getattr(args, name) for name in plan} == plan
    assert batch_size // args.num_minibatches == 256
    monkeypatch.setattr(sys, "argv", ["prog", "--design", "plan", "--num-envs", "16", "--anneal-lr"])
    args = module.parse_args()
    assert args.num_envs == 16 and args.anneal_lr and args.num_steps == 128 and args.learning_rate == 3e-4
    monkeypatch.setattr(sys, "argv", ["prog"])
    assert module.parse_args() == module.Args()


def test_plan_design_keeps_the_recurrent_replay_which_the_plans_zero_state_steps_would_break():
    """The plan's update re-runs the GRU from a zero state on shuffled single steps; under --design plan the script still
    replays whole sequences from the rollout's saved state, so the first minibatch's ratio is 1 (to float rounding). The
    plan's procedure on the same batch gives other log-probabilities."""
    args = ppo_gru_astral.Args(design="plan", **ppo_gru_astral.PLAN_CONFIG)
    # the second rollout of a plan-design run starts from a non-zero state
    run = run_main(ppo_gru_astral, "--design", "plan", "--num-envs", 8, "--total-timesteps", 2 * 8 * 128, "--seed", 0)
    agent, batch, initial_state, _, advantages, returns, _ = run.rollouts[-1]
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=args.adam_eps)
    np.random.seed(0)
    before = {name: p.detach().clone() for name, p in agent.named_parameters()}
    stats = update(ppo_gru_astral, agent, optimizer, batch, initial_state, advantages, returns, args)
    assert stats["first_minibatch_ratio_error"] < 1e-5 and stats["first_minibatch_gate_error"] < 1e-5
    agent.load_state_dict(before)
    flat_inputs = batch["inputs"].flatten(0, 1)[None]
    zero_state = torch.zeros(flat_inputs.shape[1], D)
    with torch.no_grad():
        plan_logprob = agent.get_action_and_value(
            flat_inputs, zero_state, torch.zeros(flat_inputs.shape[:2]), batch["actions"].flatten()[None]
        ).logprob
    assert (plan_logprob[0] - batch["logprobs"].flatten()).abs().max() > 1e-3


@pytest.mark.parametrize("script", ["ppo_gru_astral", "ppo_gru_baseline"])
def test_a_plan_design_run_saves_a_checkpoint_that_evaluates(script, tmp_path):
    """One documented command trains the plan's design; its checkpoint rebuilds the plan's network from its saved args."""
    flags = ["--design", "plan", "--num-steps", "16", "--total-timesteps", "128", "--save-model", "--eval-episodes", "1"]
    result = run_script(script, *flags, "--runs-dir", tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    run_dir = only_run_dir(tmp_path)
    checkpoint = torch.load(f"{run_dir}/{script}.cleanrl_model", weights_only=True)
    assert checkpoint["args"]["design"] == "plan" and checkpoint["args"]["num_envs"] == 8
    assert checkpoint["state_dict"]["actor.0.weight"].shape == (64, 64)
    module = {"ppo_gru_astral": ppo_gru_astral, "ppo_gru_baseline": ppo_gru_baseline}[script]
    out = module.evaluate(f"{run_dir}/{script}.cleanrl_model", episodes_per_mode=1)
    assert set(out["returns"]) == {0, 1, 2}


def is_orthogonal(weight, std):
    """weight (out, in) is std times a matrix with orthonormal rows (out <= in) or columns (out > in)."""
    gram = weight @ weight.T
    if weight.shape[0] > weight.shape[1]:
        gram = weight.T @ weight
    return torch.allclose(gram, std**2 * torch.eye(len(gram)), atol=1e-5 * max(std**2, 1.0))


def assert_heads(agent, width, orthogonal):
    """Heads Linear(H, width)-act-Linear(width, out); CleanRL's orthogonal init (policy std 0.01, value 1.0, zero biases)
    of encoder, heads and GRU, or PyTorch's."""
    assert agent.actor[0].weight.shape == (width, agent.hidden_size) and agent.critic[2].weight.shape == (1, width)
    layers = {agent.encoder[0]: np.sqrt(2), agent.actor[0]: np.sqrt(2), agent.actor[2]: 0.01, agent.critic[2]: 1.0}
    for layer, std in layers.items():
        assert is_orthogonal(layer.weight.detach(), std) == orthogonal
        assert bool(layer.bias.abs().max() == 0) == orthogonal
    assert bool(agent.gru.bias_ih.abs().max() == 0) == orthogonal
    assert is_orthogonal(agent.gru.weight_hh.detach(), 1.0) == orthogonal


def test_each_design_is_its_own_network():
    """The script's design: tanh layers, heads 64 wide, CleanRL's orthogonal init and an orthogonal GRU with zero biases,
    the gate Linear(H, 64)-tanh-Linear(64, K) with last layer std 0.01, FiLM one orthogonal Linear(d, 2H) that is the
    identity at z = 0. The plan's: ReLU layers of width d, PyTorch's init, the gate and FiLM MLPs, no identity."""
    torch.manual_seed(3)
    script = ppo_gru_astral.agent_from_args(ppo_gru_astral.Args(), 3)
    assert [type(m) for m in (*script.encoder, *script.actor, *script.critic)] == [nn.Linear, nn.Tanh] + [
        nn.Linear,
        nn.Tanh,
        nn.Linear,
    ] * 2
    assert_heads(script, 64, orthogonal=True)
    assert [type(m) for m in script.bank.gate] == [nn.Linear, nn.Tanh, nn.Linear]
    assert script.bank.gate[0].weight.shape == (64, 128) and script.bank.gate[2].weight.shape == (3, 64)
    assert is_orthogonal(script.bank.gate[0].weight.detach(), np.sqrt(2))
    assert is_orthogonal(script.bank.gate[2].weight.detach(), 0.01)
    assert isinstance(script.film, ppo_gru_astral.FiLM) and script.film.net.weight.shape == (2 * 128, 32)
    assert is_orthogonal(script.film.net.weight.detach(), 1.0) and script.film.net.bias.abs().max() == 0
    h = torch.randn(5, 128)
    torch.testing.assert_close(script.film(h, torch.zeros(5, 32)), h, rtol=0, atol=0)

    torch.manual_seed(3)
    plan = ppo_gru_astral.agent_from_args(ppo_gru_astral.Args(design="plan", **ppo_gru_astral.PLAN_CONFIG), 3)
    assert [type(m) for m in (*plan.encoder, *plan.actor, *plan.critic)] == [nn.Linear, nn.ReLU] + [
        nn.Linear,
        nn.ReLU,
        nn.Linear,
    ] * 2
    assert_heads(plan, D, orthogonal=False)
    assert [type(m) for m in plan.bank.gate] == [nn.Linear, nn.ReLU, nn.Linear]
    assert plan.bank.gate[2].bias.abs().max() > 0
    assert isinstance(plan.film, ppo_gru_astral.PlanFiLM) and plan.film.net[2].bias.abs().max() > 0
