"""How much can the gate move the policy? For each ASTRAL checkpoint of training seeds 1-2, replay 3 deterministic
learned-gate episodes per training mode and, at every visited state, compare the action probabilities under each
one-hot slot clamp (z = A_k) with those under the learned gate: max |Δp| and the fraction of steps whose greedy action
changes. Run from the repository root: PYTHONPATH=. python docs/results/tta_gating/leverage.py, at commit 95652a5, which
reads these checkpoints (format 1)."""

import glob

import torch

from cleanrl_astral import tta_gating as m

torch.set_num_threads(1)
for path in sorted(glob.glob("benchmark/out/cartpole_main/runs/c1__g*__s[12]/*/ppo_gru_astral.cleanrl_model")):
    ckpt, agent = m.load_astral_checkpoint(path)
    K, hide_velocity = ckpt["args"]["num_abstractions"], ckpt["args"]["hide_velocity"]
    rows = []
    clamps = [torch.eye(K)[k] for k in range(K)]
    for target in m.resolve_targets(None, None, ckpt):
        p_learned, p_clamped = [], []
        for episode in range(3):
            env = m.NonStationaryCartPole(1, target["physics"], hide_velocity)
            obs, _ = env.reset(seed=episode)
            state, prev_action, prev_reward, start, done = torch.zeros(1, agent.hidden_size), [-1], [0.0], [1.0], False
            while not done:
                inputs = (obs, prev_action, prev_reward, [target["index"]])
                with torch.no_grad():  # every clamp at the GRU state the learned gate's episode visits
                    p_clamped.append(
                        torch.stack([m.policy_step(agent, *inputs, state, start, w, True)[0].probs[0] for w in clamps])
                    )
                    dist, _, state, *_ = m.policy_step(agent, *inputs, state, start, deterministic=True)
                p_learned.append(dist.probs[0])
                action = dist.logits.argmax(-1).numpy()
                obs, reward, terminated, truncated, _ = env.step(action)
                prev_action, prev_reward, start, done = action, reward, [0.0], bool(terminated[0] or truncated[0])
        p_learned, p_clamped = torch.stack(p_learned), torch.stack(p_clamped)
        dp = [float((p_clamped[:, k] - p_learned).abs().max()) for k in range(K)]
        flips = [float((p_clamped[:, k].argmax(-1) != p_learned.argmax(-1)).float().mean()) for k in range(K)]
        rows.append(
            f"{target['name']}: {len(p_learned)} states, max|Δp| {max(dp):.3f}, "
            f"greedy action changed on {100 * max(flips):.2f}% of steps"
        )
    print(path.split("/")[4], "|", "; ".join(rows), flush=True)
