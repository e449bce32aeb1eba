"""``labkit team user add NAME --role reader|editor|admin``: a user of the team server.

Run on the server's host, as the user who started it (`make team-server`): it signs in as
the server's admin with the password file the server generated, creates NAME with a
generated password and writes its credentials to ``auth/users/NAME.netrc`` (mode 0600)
under LABKIT_TEAM_DIR. Hand that line to the user, who appends it to ``~/.netrc`` (mode
0600), or sets MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD from it.

  reader  browses, `labkit show`, `compare`, `regen`; creates and deletes nothing
  editor  logs runs in every experiment (`labkit reproduce`), manages the experiments it
          creates, deletes nobody else's
  admin   everything, user management included
"""

from __future__ import annotations

import argparse

from labkit.commands import add_json_flag, output
from labkit.provenance import team


def setup_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="labkit team", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    user = sub.add_parser("user", help="the server's users").add_subparsers(dest="action", required=True)
    add = user.add_parser("add", help="create a user with a role and a generated password")
    add.add_argument("name")
    add.add_argument("--role", required=True, choices=team.ROLES)
    add.add_argument("--machine", default=None,
                     help="the host name clients reach the server by, for the netrc line (default: the URL's)")
    add_json_flag(add)
    return p


def main(argv=None) -> int:
    args = setup_arg_parser().parse_args(argv)
    res = team.add_user(args.name, args.role, machine=args.machine)
    output(args, [f"user {res['user']} ({res['role']}) on {res['url']}; credentials in {res['credentials']} "
                  "(mode 0600): hand them over, to append to ~/.netrc"], res)
    return 0
