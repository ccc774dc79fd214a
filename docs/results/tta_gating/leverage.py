"""How much can the gate move the policy? For each ASTRAL checkpoint of training seeds 1-2, replay 3 deterministic
learned-gate episodes per training mode and, at every visited GRU state h, compare the action probabilities under each
one-hot slot clamp (z = A_k) with those under the learned gate: max |Δp| and the fraction of steps whose greedy action
changes. Run from the repository root: PYTHONPATH=. python docs/results/tta_gating/leverage.py"""
import glob

import torch

from cleanrl_astral import tta_gating as m

torch.set_num_threads(1)
for path in sorted(glob.glob("benchmark/out/cartpole_main/runs/c1__g*__s[12]/*/ppo_gru_astral.cleanrl_model")):
    ckpt, agent = m.load_astral_checkpoint(path)
    K, hide_velocity = ckpt["args"]["num_abstractions"], ckpt["args"]["hide_velocity"]
    rows = []
    for target in m.resolve_targets(None, None, ckpt):
        hidden, env = [], m.make_env(target, hide_velocity)
        for episode in range(3):
            obs, _ = env.reset(seed=episode)
            state, prev_action, prev_reward, start, done = agent.initial_state(1), -1, 0.0, 1.0, False
            while not done:
                with torch.no_grad():
                    x = agent.build_input(torch.as_tensor(obs[None]), torch.tensor([prev_action]), torch.tensor([prev_reward]),
                                          torch.tensor([target["index"]]))
                    h, state = agent.unroll(x[None], state, torch.tensor([[start]]))
                    hidden.append(h[0, 0])
                    prev_action = int(agent.actor(agent.modulate(h)[0]).argmax(-1))
                obs, prev_reward, terminated, truncated, _ = env.step(prev_action)
                start, done = 0.0, terminated or truncated
        h = torch.stack(hidden)
        with torch.no_grad():
            p_learned = torch.softmax(agent.actor(agent.modulate(h)[0]), -1)
            dp, flips = [], []
            for k in range(K):
                p_k = torch.softmax(agent.actor(agent.modulate(h, torch.eye(K)[k].expand(len(h), K))[0]), -1)
                dp.append(float((p_k - p_learned).abs().max()))
                flips.append(float((p_k.argmax(-1) != p_learned.argmax(-1)).float().mean()))
        rows.append(f"{target['name']}: {len(h)} states, max|Δp| {max(dp):.3f}, greedy action changed on {100 * max(flips):.2f}% of steps")
    print(path.split("/")[4], "|", "; ".join(rows), flush=True)
