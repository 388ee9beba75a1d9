"""The hidden verifier of a minicode_agent task (copied to its ``tests/`` with ``mc.py``).

Reads the program the agent left in ``$APP_DIR/answer`` and writes reward 1 to
``$LOGS_DIR/verifier/reward.txt`` iff it maps every case of ``cases`` (shown and hidden) right.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mc import parse, run  # noqa: E402  (the copy beside this file, not the agent's)


def main():
    reward = 0
    try:
        with open(os.path.join(os.environ["APP_DIR"], "answer")) as f:
            ops = parse(f.read().strip())
        with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "cases")) as f:
            cases = [line.strip().split(">") for line in f if line.strip()]
        reward = int(all(run(ops, i) == o for i, o in cases))
    except (OSError, ValueError) as e:
        print(f"not graded: {e}")
    out = os.path.join(os.environ["LOGS_DIR"], "verifier")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "reward.txt"), "w") as f:
        f.write(f"{reward}\n")
    print(f"reward {reward}")


if __name__ == "__main__":
    main()
