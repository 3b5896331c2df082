"""``gateway keys|users|orgs|db``: account administration from a shell.

Until the dashboard exists this is how operators issue keys and set limits.
Every command migrates the configured database first, so a fresh install
needs no separate setup step. ``keys create`` prints the raw key alone on
stdout (everything else goes to stderr) so ``KEY=$(gateway keys create ...)``
captures exactly the key.
"""

from __future__ import annotations

import argparse
import getpass
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from serve_app.auth.accounts import AccountStore, OrgRecord, UserRecord
from serve_app.auth.epoch import RedisEpochPublisher
from serve_app.auth.principal import ALL_SCOPES, ROLES
from serve_app.auth.sessions import SessionStore
from serve_app.cli.errors import CommandError
from serve_app.protocol.errors import GatewayError
from serve_app.settings import GatewaySettings
from serve_app.storage.db import Database

_SubParsers = Any  # argparse's _SubParsersAction is private and generic


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError("must be 0 (clear) or a positive number")
    return value


def _switch(text: str) -> bool:
    lowered = text.lower()
    if lowered not in ("on", "off"):
        raise argparse.ArgumentTypeError(f"expected 'on' or 'off', got {text!r}")
    return lowered == "on"


def _on_off(flag: bool) -> str:
    return "on" if flag else "off"


def _limit(value: int | None) -> str:
    return "default" if value is None else str(value)


@contextmanager
def _open_store(settings: GatewaySettings) -> Iterator[AccountStore]:
    db = Database.from_settings(settings)
    # With Redis, every gateway replica sees this command's change on its next request.
    publish = RedisEpochPublisher(settings.redis_url) if settings.redis_url else None
    try:
        db.migrate()
        yield AccountStore(db, pepper=settings.key_pepper, publish=publish)
    finally:
        db.dispose()
        if publish is not None:
            publish.close()


def session_store(store: AccountStore, settings: GatewaySettings) -> SessionStore:
    return SessionStore(
        store.database,
        store,
        ttl_s=settings.session_ttl_s,
        link_ttl_s=settings.login_link_ttl_s,
    )


# ---- handlers ----------------------------------------------------------------
def _keys_create(args: argparse.Namespace, settings: GatewaySettings) -> int:
    with _open_store(settings) as store:
        raw = store.create_key(
            args.user, args.org, role=args.role, scopes=args.scopes, rpm=args.rpm, tpm=args.tpm
        )
    print(
        f"Created an API key for user {args.user!r} in org {args.org!r}. "
        "Store it now: it cannot be shown again.",
        file=sys.stderr,
    )
    print(raw)
    return 0


def _keys_revoke(args: argparse.Namespace, settings: GatewaySettings) -> int:
    with _open_store(settings) as store:
        if not store.revoke_key(_target(args, "key")):
            raise CommandError("no active key matches that key or id (unknown or already revoked)")
    print("Key revoked; gateways stop accepting it within the auth cache interval.")
    return 0


def _keys_list(args: argparse.Namespace, settings: GatewaySettings) -> int:
    with _open_store(settings) as store:
        keys = store.list_keys(args.user)
    if not keys:
        print(f"User {args.user!r} has no keys.", file=sys.stderr)
        return 0
    print(f"{'ID':<28} {'PREFIX':<14} {'ORG':<20} {'SCOPES':<20} {'CREATED':<20} STATUS")
    for key in keys:
        status = "active" if key.revoked_at is None else f"revoked {key.revoked_at:%Y-%m-%d}"
        print(
            f"{key.key_id:<28} {key.display_prefix + '...':<14} {key.org:<20} "
            f"{','.join(sorted(key.scopes)):<20} {key.created_at:%Y-%m-%d %H:%M:%S}  {status}"
        )
    return 0


def _describe_user(user: UserRecord) -> str:
    return (
        f"user {user.name}: rpm={_limit(user.limits.rpm)} tpm={_limit(user.limits.tpm)} "
        f"daily_tokens={_limit(user.limits.daily_tokens)} "
        f"web_search={_on_off(user.web_search_enabled)} "
        f"web_fetch={_on_off(user.web_fetch_enabled)} "
        f"code_interpreter={_on_off(user.code_interpreter_enabled)}"
    )


def _describe_org(org: OrgRecord) -> str:
    return (
        f"org {org.name}: external_providers={_on_off(org.external_providers_enabled)} "
        f"internal={_on_off(org.internal)}"
    )


def _users_update(args: argparse.Namespace, settings: GatewaySettings) -> int:
    changes = {
        "rpm": args.rpm,
        "tpm": args.tpm,
        "daily_tokens": args.daily_tokens,
        "web_search": args.web_search,
        "web_fetch": args.web_fetch,
        "code_interpreter": args.code_interpreter,
    }
    if all(value is None for value in changes.values()):
        raise CommandError("nothing to update: give at least one option (see --help)")
    with _open_store(settings) as store:
        print(_describe_user(store.update_user(_target(args, "user"), **changes)))
    return 0


def _read_password(args: argparse.Namespace) -> str:
    """From the terminal (asked twice, not echoed), or the first line of stdin when piped."""
    if not sys.stdin.isatty():
        return sys.stdin.readline().rstrip("\r\n")
    first = getpass.getpass(f"New password for {_target(args, 'user')}: ")
    if getpass.getpass("Again: ") != first:
        raise CommandError("the two passwords differ; nothing was changed")
    return first


def _users_set_password(args: argparse.Namespace, settings: GatewaySettings) -> int:
    password = _read_password(args)
    with _open_store(settings) as store:
        sessions = session_store(store, settings)
        try:
            sessions.set_password(_target(args, "user"), password)
        except GatewayError as error:
            raise CommandError(error.message) from None
    print(
        f"Password set for {_target(args, 'user')}; their other dashboard sessions ended. "
        "Sign in at /dashboard."
    )
    return 0


def _users_login_link(args: argparse.Namespace, settings: GatewaySettings) -> int:
    with _open_store(settings) as store:
        sessions = session_store(store, settings)
        try:
            token = sessions.create_login_token(_target(args, "user"))
        except GatewayError as error:
            raise CommandError(error.message) from None
    minutes = settings.login_link_ttl_s // 60
    print(
        f"One-time sign-in link for {_target(args, 'user')} (valid {minutes} min, once):",
        file=sys.stderr,
    )
    print(f"{args.base_url.rstrip('/')}/dashboard/login/token?token={token}")
    return 0


def _orgs_update(args: argparse.Namespace, settings: GatewaySettings) -> int:
    if args.external_providers is None and args.internal is None:
        raise CommandError("nothing to update: give at least one option (see --help)")
    with _open_store(settings) as store:
        org = store.update_org(
            _target(args, "org"),
            external_providers=args.external_providers,
            internal=args.internal,
        )
    print(_describe_org(org))
    return 0


def _db_migrate(args: argparse.Namespace, settings: GatewaySettings) -> int:
    db = Database.from_settings(settings)
    try:
        applied = db.migrate()
    finally:
        db.dispose()
    if applied:
        print(f"Applied migrations {', '.join(map(str, applied))} to {db.display_url}")
    else:
        print(f"{db.display_url} is up to date.")
    return 0


# ---- parsers -----------------------------------------------------------------
def _add_target(parser: argparse.ArgumentParser, name: str, metavar: str, what: str) -> None:
    """The object a command acts on, written ``update alice`` or ``update --user alice``.

    ``keys create`` names its user with ``--user``; accepting the same spelling on
    the commands that take a positional spares operators a usage error. Exactly one
    of the two forms must be given (argparse answers a usage error otherwise).
    """
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument(name, nargs="?", metavar=metavar, help=what)
    group.add_argument(f"--{name}", dest=f"{name}_option", metavar=metavar, help=f"{what} (same)")


def _target(args: argparse.Namespace, name: str) -> str:
    value = getattr(args, name) or getattr(args, f"{name}_option")
    assert isinstance(value, str)  # the required group guarantees one of the two
    return value


def _register_keys(subparsers: _SubParsers) -> None:
    keys = subparsers.add_parser("keys", help="create, revoke and list API keys")
    commands = keys.add_subparsers(title="keys commands", dest="keys_command", required=True)

    create = commands.add_parser(
        "create",
        help="create a key (printed alone on the last stdout line)",
        description="Create an API key; the user and org are created when missing.",
    )
    create.add_argument("--user", required=True, help="user name")
    create.add_argument("--org", required=True, help="organization name")
    create.add_argument(
        "--role",
        choices=sorted(ROLES),
        default=None,
        help="membership role (default: keep the current one; new members get 'member')",
    )
    create.add_argument(
        "--scopes",
        default=None,
        help=f"comma-separated scopes from {','.join(sorted(ALL_SCOPES))} (default: all)",
    )
    create.add_argument("--rpm", type=_non_negative_int, help="requests per minute for this key")
    create.add_argument("--tpm", type=_non_negative_int, help="tokens per minute for this key")
    create.set_defaults(handler=_keys_create)

    revoke = commands.add_parser("revoke", help="revoke a key by raw key or key id")
    _add_target(revoke, "key", "KEY", "the raw key or its id (key_...)")
    revoke.set_defaults(handler=_keys_revoke)

    listing = commands.add_parser("list", help="list a user's keys (ids and prefixes only)")
    listing.add_argument("--user", required=True, help="user name")
    listing.set_defaults(handler=_keys_list)


def _register_users_orgs(subparsers: _SubParsers) -> None:
    users = subparsers.add_parser("users", help="change user limits and feature flags")
    user_commands = users.add_subparsers(
        title="users commands", dest="users_command", required=True
    )
    update = user_commands.add_parser(
        "update",
        help="change only the given settings of a user",
        description="Change only the given settings; a limit of 0 returns it to the default.",
    )
    _add_target(update, "user", "USER", "user name")
    for flag, what in (("--rpm", "requests/min"), ("--tpm", "tokens/min")):
        update.add_argument(flag, type=_non_negative_int, metavar="N", help=f"{what}; 0 clears")
    update.add_argument(
        "--daily-tokens", type=_non_negative_int, metavar="N", help="daily token quota; 0 clears"
    )
    for name in ("web-search", "web-fetch", "code-interpreter"):
        update.add_argument(f"--{name}", type=_switch, metavar="on|off", help=f"{name} tool")
    update.set_defaults(handler=_users_update)

    set_password = user_commands.add_parser(
        "set-password",
        help="set a user's dashboard password (asked on the terminal, or one line of stdin)",
        description="Set the password a user signs in to /dashboard with; their other "
        "sessions end. The user must exist (gateway keys create makes users).",
    )
    _add_target(set_password, "user", "USER", "user name")
    set_password.set_defaults(handler=_users_set_password)

    link = user_commands.add_parser(
        "login-link",
        help="print a one-time dashboard sign-in link for a user",
        description="Print a link that signs the user in once, within GATEWAY_LOGIN_LINK_TTL_S.",
    )
    _add_target(link, "user", "USER", "user name")
    link.add_argument(
        "--base-url",
        default="http://127.0.0.1:8000",
        help="where browsers reach the gateway (default http://127.0.0.1:8000)",
    )
    link.set_defaults(handler=_users_login_link)

    orgs = subparsers.add_parser("orgs", help="change organization flags")
    org_commands = orgs.add_subparsers(title="orgs commands", dest="orgs_command", required=True)
    org_update = org_commands.add_parser("update", help="change only the given org flags")
    _add_target(org_update, "org", "ORG", "organization name")
    org_update.add_argument(
        "--external-providers", type=_switch, metavar="on|off", help="allow external providers"
    )
    org_update.add_argument(
        "--internal", type=_switch, metavar="on|off", help="mark as an internal organization"
    )
    org_update.set_defaults(handler=_orgs_update)


def register(subparsers: _SubParsers) -> None:
    """Add the ``keys``, ``users``, ``orgs`` and ``db`` commands to ``gateway``."""
    _register_keys(subparsers)
    _register_users_orgs(subparsers)
    db = subparsers.add_parser("db", help="database maintenance")
    db_commands = db.add_subparsers(title="db commands", dest="db_command", required=True)
    migrate = db_commands.add_parser("migrate", help="apply pending schema migrations")
    migrate.set_defaults(handler=_db_migrate)
