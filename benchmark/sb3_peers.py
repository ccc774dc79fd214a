"""Peers for the side-by-side benchmark: stable-baselines3 PPO (MLP) and sb3-contrib RecurrentPPO (LSTM) on
NonStationaryCartPole, logging the same TensorBoard tags and eval.json as cleanrl_astral/ppo_gru_baseline.py.

Hyperparameters default to the rl-baselines3-zoo tuned settings, ppo.yml CartPole-v1 for `ppo` and
ppo_lstm.yml CartPoleNoVel-v1 for `recurrent_ppo`, which share: 8 envs x 32 steps, batch 256, 20 epochs, gamma 0.98,
GAE lambda 0.8, no entropy bonus, learning rate and clip range decayed linearly from 1e-3 and 0.2. The recurrent
entry adds its policy (ReLU, no orthogonal init, LSTM 64 wide with a separate critic LSTM, one 64-unit layer per
head) and observation normalisation (VecNormalize, observations only); the running statistics are saved with the
model and applied, frozen, at evaluation. The environment section below is ppo_gru_baseline.py's NonStationaryCartPole
in gymnasium form, one CartPole-v1 per env as SB3's DummyVecEnv steps them; tests/test_benchmark_sb3_peers.py checks that both
give the same trajectories from the same states and actions.

Usage: python benchmark/sb3_peers.py --algo recurrent_ppo --modes-preset seed3 --hide-velocity --save-model
"""

import dataclasses
import itertools
import math
import os
import random
import sys
import time
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
import tyro
from sb3_contrib import RecurrentPPO
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.logger import configure
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize
from torch.utils.tensorboard import SummaryWriter

SCRIPT = os.path.basename(__file__)[: -len(".py")]
ALGOS = {"ppo": (PPO, "MlpPolicy"), "recurrent_ppo": (RecurrentPPO, "MlpLstmPolicy")}


@dataclass
class Args:
    exp_name: str = SCRIPT
    """the name of this experiment (the algorithm is appended: sb3_peers_ppo, sb3_peers_recurrent_ppo)"""
    seed: int = 1
    """seed of the experiment"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
    cuda: bool = False
    """if toggled, cuda will be used when available"""
    track: bool = False
    """if toggled, this experiment will be tracked with Weights and Biases"""
    wandb_project_name: str = "cleanrl_astral"
    """the wandb's project name"""
    wandb_entity: str | None = None
    """the entity (team) of wandb's project"""
    capture_video: bool = False
    """record one deterministic evaluation episode per mode into `runs/{run_name}/videos` (needs --save-model)"""
    save_model: bool = False
    """save the policy to `runs/{run_name}/{exp_name}.cleanrl_model`, then evaluate it into eval.json"""
    runs_dir: str = "runs"
    """directory under which `{run_name}/` is written"""
    eval_episodes: int = 10
    """evaluation episodes per mode, each for deterministic and for sampled actions"""
    torch_threads: int = 1
    """torch CPU threads"""

    # Environment
    env_id: str = "NonStationaryCartPole"
    """name used in the run name"""
    modes_preset: str = "seed3"
    """physics modes: `seed3`, `inverted4` (seed3 plus inverted force) or `mirror4` (mode 4 held out of training)"""
    modes: str | None = None
    """custom modes, overriding the preset: "g,l[,sign] g,l[,sign] ..." (gravity, pole half-length, force sign)"""
    hide_velocity: bool = False
    """observe only cart position and pole angle, so velocities must be inferred from memory"""
    fixed_mode: int | None = None
    """always use this mode index instead of resampling it"""
    switch_prob: float = 0.0
    """per-step probability of resampling the mode in the middle of an episode"""

    # Algorithm (rl-baselines3-zoo CartPole defaults)
    algo: str = "ppo"
    """`ppo`: SB3 PPO with an MLP policy; `recurrent_ppo`: sb3-contrib RecurrentPPO with an LSTM policy"""
    total_timesteps: int = 100000
    """total timesteps of the experiment"""
    learning_rate: float = 1e-3
    """initial learning rate (decayed linearly to 0 when --anneal-lr)"""
    anneal_lr: bool = True
    """decay the learning rate and the clip range linearly to 0 (the zoo's lin_ schedules)"""
    num_envs: int = 8
    """the number of parallel environments"""
    num_steps: int = 32
    """steps per environment per rollout"""
    minibatch_size: int = 256
    """the mini-batch size"""
    update_epochs: int = 20
    """the K epochs to update the policy"""
    gamma: float = 0.98
    """the discount factor gamma"""
    gae_lambda: float = 0.8
    """the lambda for the general advantage estimation"""
    clip_coef: float = 0.2
    """the initial surrogate clipping coefficient"""
    ent_coef: float = 0.0
    """coefficient of the entropy"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""
    lstm_hidden_size: int = 64
    """recurrent_ppo: LSTM width (the zoo's CartPoleNoVel-v1 setting)"""


# ENVIRONMENT
# A mode is (gravity, pole half-length, force sign).
MODE_PRESETS = {
    "seed3": [(9.8, 0.5, 1.0), (7.5, 0.7, 1.0), (12.0, 0.4, 1.0)],
    "inverted4": [(9.8, 0.5, 1.0), (7.5, 0.7, 1.0), (12.0, 0.4, 1.0), (9.8, 0.5, -1.0)],
    "mirror4": [(9.8, 0.5, 1.0), (9.8, 0.5, -1.0), (7.5, 0.7, 1.0), (7.5, 0.7, -1.0), (8.65, 0.6, -1.0)],
}
HELD_OUT_MODES = {"seed3": [], "inverted4": [], "mirror4": [4]}  # evaluated only, never drawn in training


def parse_modes(spec: str) -> list:
    """Parse "g,l[,sign] g,l[,sign] ..." into a list of (gravity, half_length, force_sign)."""
    modes = []
    for item in spec.split():
        parts = item.split(",")
        try:
            values = [float(p) for p in parts]
        except ValueError:
            values = []
        if len(values) not in (2, 3):
            raise ValueError(
                f"malformed mode {item!r} in --modes; write gravity,half_length[,force_sign] e.g. '9.8,0.5 7.5,0.7,-1'"
            )
        gravity = values[0]
        half_length = values[1]
        sign = 1.0
        if len(values) == 3:
            sign = values[2]
        if not np.isfinite(gravity) or gravity <= 0 or not np.isfinite(half_length) or half_length <= 0:
            raise ValueError(f"mode {item!r} in --modes needs a positive gravity and a positive half-length")
        if sign not in (1.0, -1.0):
            raise ValueError(f"mode {item!r} in --modes has force sign {sign:g}; use 1 or -1")
        modes.append((gravity, half_length, sign))
    if not modes:
        raise ValueError("--modes is empty; give at least one mode such as '9.8,0.5'")
    return modes


def resolve_modes(modes_preset: str, modes: str | None) -> list:
    if modes is not None:
        return parse_modes(modes)
    if modes_preset not in MODE_PRESETS:
        raise ValueError(f"unknown --modes-preset {modes_preset!r}; choose one of {', '.join(MODE_PRESETS)} or give --modes")
    return list(MODE_PRESETS[modes_preset])


class NonStationaryCartPole(gym.Wrapper):
    """CartPole-v1 whose hidden physics mode (gravity, pole half-length, force sign) is resampled at every
    episode start, and with probability `switch_prob` after any step. `info["mode"]` is for analysis only:
    it is the mode that governs the next step."""

    def __init__(self, env, modes, hide_velocity=False, fixed_mode=None, switch_prob=0.0, held_out=()):
        super().__init__(env)
        self.modes = [tuple(float(v) for v in m) for m in modes]
        self.train_modes = [k for k in range(len(self.modes)) if k not in held_out]
        self.hide_velocity = hide_velocity
        self.fixed_mode = fixed_mode
        self.switch_prob = switch_prob
        self.base_force_mag = abs(env.unwrapped.force_mag)
        self.mode_rng = np.random.default_rng()
        self.mode = 0
        if hide_velocity:
            high = env.observation_space.high[[0, 2]]
            self.observation_space = gym.spaces.Box(-high, high, dtype=np.float32)

    def set_mode(self, k):
        self.mode = int(k)
        gravity, half_length, force_sign = self.modes[self.mode]
        cartpole = self.env.unwrapped
        cartpole.gravity = gravity
        cartpole.length = half_length
        # CartPole caches this product; it must follow the length or the dynamics mix two poles
        cartpole.polemass_length = cartpole.masspole * half_length
        cartpole.force_mag = force_sign * self.base_force_mag

    def sample_mode(self):
        if self.fixed_mode is not None:
            return self.fixed_mode
        return self.train_modes[int(self.mode_rng.integers(len(self.train_modes)))]

    def observe(self, obs):
        return obs[[0, 2]] if self.hide_velocity else obs

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            # a stream of its own, so the mode sequence does not shift CartPole's initial states
            self.mode_rng = np.random.default_rng([seed, 1])
        obs, info = self.env.reset(seed=seed, options=options)
        self.set_mode(self.sample_mode())
        info["mode"] = self.mode
        return self.observe(obs), info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        if self.switch_prob > 0 and self.mode_rng.random() < self.switch_prob:
            self.set_mode(self.sample_mode())
        info["mode"] = self.mode
        return self.observe(obs), reward, terminated, truncated, info


def make_env(modes, hide_velocity=False, fixed_mode=None, switch_prob=0.0, render_mode=None, held_out=()):
    def thunk():
        env = gym.make("CartPole-v1", render_mode=render_mode)
        return NonStationaryCartPole(env, modes, hide_velocity, fixed_mode, switch_prob, held_out)

    return thunk


# MODEL
def build_model(args, env, device="cpu"):
    """The SB3 algorithm object for `args.algo` on the vectorised env, with the zoo's schedules."""
    algo_class, policy = ALGOS[args.algo]

    def schedule(initial):
        """The zoo's lin_ schedule (a function of SB3's progress_remaining, 1 -> 0 over training), or a constant."""
        if not args.anneal_lr:
            return initial

        def linear(progress_remaining):
            return progress_remaining * initial

        return linear

    kwargs = dict(
        n_steps=args.num_steps,
        batch_size=args.minibatch_size,
        n_epochs=args.update_epochs,
        gamma=args.gamma,
        gae_lambda=args.gae_lambda,
        clip_range=schedule(args.clip_coef),
        ent_coef=args.ent_coef,
        vf_coef=args.vf_coef,
        max_grad_norm=args.max_grad_norm,
        learning_rate=schedule(args.learning_rate),
        seed=args.seed,
        device=device,
        verbose=0,
    )
    if args.algo == "recurrent_ppo":
        # rl-baselines3-zoo ppo_lstm.yml, CartPoleNoVel-v1
        kwargs["policy_kwargs"] = dict(
            ortho_init=False,
            activation_fn=torch.nn.ReLU,
            lstm_hidden_size=args.lstm_hidden_size,
            enable_critic_lstm=True,
            net_arch=dict(pi=[64], vf=[64]),
        )
    return algo_class(policy, env, **kwargs)


def normalizes_obs(algo):
    """The zoo normalises observations (not rewards) for the recurrent entry only."""
    return algo == "recurrent_ppo"


def obs_normalizer(stats):
    """VecNormalize's frozen observation transform from saved statistics (identity when there are none)."""
    if stats is None:
        return identity
    mean = stats["mean"].numpy()
    var = stats["var"].numpy()
    clip = float(stats["clip_obs"])
    eps = float(stats["epsilon"])

    def normalize(obs):
        return np.clip((obs - mean) / np.sqrt(var + eps), -clip, clip).astype(np.float32)

    return normalize


def identity(obs):
    return obs


def make_sb3_env(num_envs, modes, hide_velocity=False, fixed_mode=None, switch_prob=0.0, held_out=()):
    # SB3's DummyVecEnv resets a finished env inside step(): the returned obs is the next episode's first obs,
    # the last one is in info["terminal_observation"] and truncations are bootstrapped by SB3 itself, so no
    # transition spans two episodes; the new episode's info (its mode) is in `reset_infos`.
    return DummyVecEnv([make_env(modes, hide_velocity, fixed_mode, switch_prob, held_out=held_out) for _ in range(num_envs)])


class CleanRLLogger(BaseCallback):
    """Writes CleanRL's TensorBoard tags from SB3's rollouts: one charts/episodic_return(_mode{k}) point per
    finished episode (k = the mode the episode started in, as in ppo_gru_baseline.py), SPS and the losses."""

    LOSSES = {
        "train/value_loss": "losses/value_loss",
        "train/policy_gradient_loss": "losses/policy_loss",
        "train/approx_kl": "losses/approx_kl",
        "train/clip_fraction": "losses/clipfrac",
        "train/explained_variance": "losses/explained_variance",
        "train/learning_rate": "charts/learning_rate",
    }

    def __init__(self, writer, print_every_steps):
        super().__init__()
        self.writer = writer
        self.print_every_steps = print_every_steps
        self.recent = []  # returns of the last 100 episodes
        self.recent_by_mode = {}  # mode -> returns of its last 100 episodes

    def _on_training_start(self):
        n = self.training_env.num_envs
        self.base_env = self.training_env
        while hasattr(self.base_env, "venv"):  # VecNormalize keeps reset_infos of its own, empty: read the inner env's
            self.base_env = self.base_env.venv
        self.episode_return = np.zeros(n)
        self.episode_length = np.zeros(n, dtype=int)
        self.episode_mode = np.array([info["mode"] for info in self.base_env.reset_infos])
        self.start_time = time.time()
        self.start_step = self.num_timesteps
        self.last_print = self.num_timesteps

    def _on_step(self):
        self.episode_return += self.locals["rewards"]
        self.episode_length += 1
        for i in np.flatnonzero(self.locals["dones"]):
            ret = float(self.episode_return[i])
            mode = int(self.episode_mode[i])
            self.writer.add_scalar("charts/episodic_return", ret, self.num_timesteps)
            self.writer.add_scalar("charts/episodic_length", int(self.episode_length[i]), self.num_timesteps)
            self.writer.add_scalar(f"charts/episodic_return_mode{mode}", ret, self.num_timesteps)
            self.recent = (self.recent + [ret])[-100:]
            self.recent_by_mode[mode] = (self.recent_by_mode.get(mode, []) + [ret])[-100:]
            self.episode_return[i] = 0.0
            self.episode_length[i] = 0
            self.episode_mode[i] = self.base_env.reset_infos[i]["mode"]
        return True

    def log_losses(self):
        # SB3 records the losses of an update and clears them at its next log dump, which comes after the
        # next rollout: they are read here, one rollout late, and at the end of training
        values = self.model.logger.name_to_value
        for sb3_key, tag in self.LOSSES.items():
            if sb3_key in values:
                self.writer.add_scalar(tag, values[sb3_key], self.num_timesteps)
        if "train/entropy_loss" in values:
            self.writer.add_scalar("losses/entropy", -values["train/entropy_loss"], self.num_timesteps)

    def _on_rollout_end(self):
        self.log_losses()
        sps = int((self.num_timesteps - self.start_step) / max(time.time() - self.start_time, 1e-9))
        self.writer.add_scalar("charts/SPS", sps, self.num_timesteps)
        if self.num_timesteps - self.last_print >= self.print_every_steps:
            self.last_print = self.num_timesteps
            by_mode = " ".join(f"m{k} {np.mean(v):.0f}" for k, v in sorted(self.recent_by_mode.items()))
            mean_recent = f"{np.mean(self.recent):.1f}" if self.recent else "-"
            print(f"step {self.num_timesteps} SPS {sps} return {mean_recent} | {by_mode}", flush=True)

    def _on_training_end(self):
        self.log_losses()


# CHECKPOINTS / EVALUATION
def load_policy(model_path, device="cpu"):
    """Rebuilds the SB3 model saved by this script; returns (model, training Args, training modes, observation
    transform applied before the policy)."""
    if not os.path.isfile(model_path):
        raise ValueError(f"model {model_path!r} does not exist")
    ckpt = torch.load(model_path, map_location="cpu", weights_only=True)
    if not isinstance(ckpt, dict) or ckpt.get("script") != SCRIPT:
        raise ValueError(f"model {model_path!r} was not written by {SCRIPT}.py")
    train_args = Args(**ckpt["args"])
    modes = [tuple(m) for m in ckpt["modes"]]
    model = build_model(train_args, make_sb3_env(train_args.num_envs, modes, train_args.hide_velocity), device)
    model.policy.load_state_dict(ckpt["state_dict"])
    model.policy.set_training_mode(False)
    return model, train_args, modes, obs_normalizer(ckpt.get("obs_rms"))


def evaluate(model_path, episodes_per_mode=10, modes=None, deterministic=True, seed=0, video_dir=None, device="cpu"):
    """Runs `episodes_per_mode` episodes in each mode of `modes` (default: the training modes) with the saved
    policy, the first episode of each of `episodes_per_mode` envs. Returns {mode index: array of returns}."""
    model, train_args, train_modes, prep = load_policy(model_path, device)
    modes = train_modes if modes is None else [tuple(float(v) for v in m) for m in modes]
    results = {}
    for k in range(len(modes)):
        envs = make_sb3_env(episodes_per_mode, modes, train_args.hide_velocity, fixed_mode=k)
        envs.seed(seed + 1000 * k)
        obs = envs.reset()
        state = None
        starts = np.ones(episodes_per_mode, dtype=bool)
        returns = np.zeros(episodes_per_mode)
        finished = np.zeros(episodes_per_mode, dtype=bool)
        while not finished.all():
            action, state = model.predict(prep(obs), state=state, episode_start=starts, deterministic=deterministic)
            obs, reward, done, _ = envs.step(action)
            returns += reward * ~finished
            finished |= done
            starts = done
        envs.close()
        results[k] = returns
        if video_dir is not None:
            record_episode(model, prep, modes, train_args.hide_velocity, k, video_dir, seed)
    return results


def record_episode(model, prep, modes, hide_velocity, k, video_dir, seed):
    """One deterministic episode of mode k, saved as video_dir/mode{k}-episode-0.mp4."""
    env = make_env(modes, hide_velocity, fixed_mode=k, render_mode="rgb_array")()
    env = gym.wrappers.RecordVideo(env, video_dir, name_prefix=f"mode{k}", episode_trigger=every_episode)
    obs, _ = env.reset(seed=seed)
    state = None
    start = np.ones(1, dtype=bool)
    done = False
    while not done:
        action, state = model.predict(prep(obs[None]), state=state, episode_start=start, deterministic=True)
        obs, _, terminated, truncated, _ = env.step(int(action[0]))
        start = np.zeros(1, dtype=bool)
        done = terminated or truncated
    env.close()


def evaluation_report(model_path, args, modes, video_dir, device, writer, global_step):
    """eval.json's content: per mode, the returns of --eval-episodes episodes with deterministic and with sampled
    actions (each also logged as eval/episodic_return_mode{k}_{kind}), and their means over modes."""
    report = {
        "script": SCRIPT,
        "checkpoint": model_path,
        "episodes_per_mode": args.eval_episodes,
        "modes": [{"gravity": g, "half_length": length, "force_sign": s} for g, length, s in modes],
        "per_mode": {},
    }
    for kind, deterministic in (("deterministic", True), ("sampled", False)):
        # the video shows the deterministic episodes
        kind_video_dir = None
        if deterministic:
            kind_video_dir = video_dir
        results = evaluate(
            model_path,
            args.eval_episodes,
            deterministic=deterministic,
            seed=args.seed + 100_000,
            video_dir=kind_video_dir,
            device=device,
        )
        for k, rets in results.items():
            report["per_mode"].setdefault(str(k), {})[kind] = {
                "mean": float(np.mean(rets)),
                "std": float(np.std(rets)),
                "returns": rets.tolist(),
            }
            writer.add_scalar(f"eval/episodic_return_mode{k}_{kind}", float(np.mean(rets)), global_step)
        report[f"{kind}_mean"] = float(np.mean([np.mean(r) for r in results.values()]))
    return report


def print_evaluation(report, modes):
    print(f"evaluation over {report['episodes_per_mode']} episodes per mode (mean ± std):")
    print("mode  gravity  half_len  sign  deterministic    sampled")
    for k, (g, length, s) in enumerate(modes):
        det = report["per_mode"][str(k)]["deterministic"]
        sampled = report["per_mode"][str(k)]["sampled"]
        print(
            f"{k:>4}  {g:7.2f}  {length:8.2f}  {s:+4.0f}  "
            f"{det['mean']:6.1f} ± {det['std']:5.1f}  {sampled['mean']:6.1f} ± {sampled['std']:5.1f}"
        )


def every_episode(episode_id):
    return True


def fail(message):
    print(f"{SCRIPT}.py: error: {message}", file=sys.stderr)
    sys.exit(2)


def validate(args):
    """Every check that can fail before training starts; returns the resolved modes."""
    # NaN and inf pass every `x <= 0` check below and reach SB3's optimizer: refused first
    for field in dataclasses.fields(Args):
        value = getattr(args, field.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"--{field.name.replace('_', '-')} {value} must be a finite number")
    if not 0 <= args.seed < 2**32:
        raise ValueError(f"--seed {args.seed} must be in [0, 2**32 - 1]")
    # the name becomes part of a directory name and of the model file's name: a '/' makes the save fail after training
    if not args.exp_name.strip() or "/" in args.exp_name:
        raise ValueError(f"--exp-name {args.exp_name!r} must be a non-empty name without '/'")
    if not 0.0 < args.gamma <= 1.0 or not 0.0 <= args.gae_lambda <= 1.0:
        raise ValueError(f"--gamma {args.gamma} must be in (0, 1] and --gae-lambda {args.gae_lambda} in [0, 1]")
    for name in ("clip_coef", "max_grad_norm"):
        if getattr(args, name) <= 0:
            raise ValueError(f"--{name.replace('_', '-')} {getattr(args, name)} must be positive")
    for name in ("ent_coef", "vf_coef"):
        if getattr(args, name) < 0:
            raise ValueError(f"--{name.replace('_', '-')} {getattr(args, name)} must be non-negative")
    if args.minibatch_size < 2:
        raise ValueError("--minibatch-size must be at least 2 (SB3 normalises advantages per minibatch)")
    modes = resolve_modes(args.modes_preset, args.modes)
    if args.algo not in ALGOS:
        raise ValueError(f"unknown --algo {args.algo!r}; choose one of {', '.join(ALGOS)}")
    if args.fixed_mode is not None and not 0 <= args.fixed_mode < len(modes):
        raise ValueError(f"--fixed-mode {args.fixed_mode} is out of range; there are {len(modes)} modes (0..{len(modes) - 1})")
    if args.modes is None and args.fixed_mode in HELD_OUT_MODES[args.modes_preset]:
        raise ValueError(f"--fixed-mode {args.fixed_mode} is held out of training in {args.modes_preset} (evaluation only)")
    for name in (
        "num_envs",
        "num_steps",
        "minibatch_size",
        "update_epochs",
        "eval_episodes",
        "torch_threads",
        "lstm_hidden_size",
    ):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
    if not 0.0 <= args.switch_prob <= 1.0:
        raise ValueError(f"--switch-prob {args.switch_prob} must be in [0, 1]")
    if args.learning_rate <= 0:
        raise ValueError("--learning-rate must be positive")
    if args.total_timesteps < args.num_envs * args.num_steps:
        raise ValueError(
            f"--total-timesteps {args.total_timesteps} is less than one rollout "
            f"(--num-envs x --num-steps = {args.num_envs * args.num_steps})"
        )
    if args.capture_video and not args.save_model:
        raise ValueError("--capture-video records evaluation episodes; add --save-model")
    return modes


def claim_run_dir(runs_dir, run_name):
    """Creates runs_dir/run_name (run_name__2, __3, ... if a run started in the same second took it): (name, dir)."""
    if os.path.exists(runs_dir) and not os.path.isdir(runs_dir):
        raise ValueError(f"--runs-dir {runs_dir}: cannot create the run directory (not a directory); give a directory")
    os.makedirs(runs_dir, exist_ok=True)
    name = run_name
    for n in itertools.count(2):
        try:
            os.mkdir(os.path.join(runs_dir, name))
            return name, os.path.join(runs_dir, name)
        except FileExistsError:
            name = f"{run_name}__{n}"


if __name__ == "__main__":
    args = tyro.cli(Args)
    try:
        modes = validate(args)
    except ValueError as e:
        fail(str(e))
    exp_name = args.exp_name if args.exp_name != SCRIPT else f"{SCRIPT}_{args.algo}"
    try:
        run_name, run_dir = claim_run_dir(args.runs_dir, f"{args.env_id}__{exp_name}__{args.seed}__{int(time.time())}")
    except ValueError as e:
        fail(str(e))
    except OSError as e:  # --runs-dir is not writable
        fail(f"--runs-dir {args.runs_dir}: cannot create the run directory ({e.strerror}); give a writable directory")

    if args.track:
        import wandb

        wandb.init(
            project=args.wandb_project_name,
            entity=args.wandb_entity,
            sync_tensorboard=True,
            config=vars(args),
            name=run_name,
            dir=run_dir,
            save_code=True,
        )
    writer = SummaryWriter(run_dir)
    writer.add_text(
        "hyperparameters",
        "|param|value|\n|-|-|\n" + "\n".join([f"|{key}|{value}|" for key, value in vars(args).items()]),
    )

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    torch.set_num_threads(args.torch_threads)
    device = "cuda" if torch.cuda.is_available() and args.cuda else "cpu"

    # ROLLOUT / UPDATE: SB3's learn() loop; the callback does the LOGGING
    envs = make_sb3_env(
        args.num_envs,
        modes,
        args.hide_velocity,
        args.fixed_mode,
        args.switch_prob,
        held_out=HELD_OUT_MODES[args.modes_preset] if args.modes is None else (),
    )
    if normalizes_obs(args.algo):
        envs = VecNormalize(envs, norm_obs=True, norm_reward=False, gamma=args.gamma)
    model = build_model(args, envs, device)
    model.set_logger(configure(None, []))
    model.learn(args.total_timesteps, callback=CleanRLLogger(writer, max(args.total_timesteps // 50, 1)))
    obs_rms = None
    if isinstance(envs, VecNormalize):
        obs_rms = {
            "mean": torch.as_tensor(envs.obs_rms.mean),
            "var": torch.as_tensor(envs.obs_rms.var),
            "clip_obs": envs.clip_obs,
            "epsilon": envs.epsilon,
        }
    envs.close()

    if args.save_model:
        from cleanrl_astral_utils.files import atomic_torch_save, atomic_write_json

        model_path = os.path.join(run_dir, f"{exp_name}.cleanrl_model")
        atomic_torch_save(
            {
                "script": SCRIPT,
                "args": dataclasses.asdict(args),
                "modes": modes,
                "run_name": run_name,
                "state_dict": model.policy.state_dict(),
                "obs_rms": obs_rms,
            },
            model_path,
        )
        print(f"model saved to {model_path}")
        video_dir = None
        if args.capture_video:
            video_dir = os.path.join(run_dir, "videos")
        report = evaluation_report(model_path, args, modes, video_dir, device, writer, model.num_timesteps)
        print_evaluation(report, modes)
        atomic_write_json(report, os.path.join(run_dir, "eval.json"), indent=1)

    writer.close()
