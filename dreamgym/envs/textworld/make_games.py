"""The child process of `dreamgym.envs.textworld.games.make_games`: makes the games whose specs it
reads as JSON on stdin into the folder it is given, and says `made <path>` for each.

    PYTHONHASHSEED=0 python -m dreamgym.envs.textworld.make_games OUT_DIR < specs.json
"""

import sys

from dreamgym.envs.textworld.games import make_games_here

if __name__ == "__main__":
    out_dir, sys.argv[0] = sys.argv[1], "tw-make"  # tw-make's parser names itself in its errors
    make_games_here(out_dir)
