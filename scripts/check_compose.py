"""docker-compose.yml agrees with the local stack and with config/stampede.toml.

The local stack (scripts/stack.sh) is the reference: its settings' defaults give the
ports, its health_<part> functions the probes, its core_env the core's settings. This
checks, naming every mismatch it finds:

- every part of the stack is a compose service, and the other way round;
- every port compose uses equals the stack's default for it: the core's addresses (also
  against config/stampede.toml), `<service>:<port>` references, the edge's *_PORT
  variables, deploy/broker.conf; published ports only on 127.0.0.1, same port inside;
- every STAMPEDE_<SECTION>__<KEY> set in compose is a setting config/stampede.toml
  documents ([section] key, or key_file); the edge's other keys are read by its
  entrypoint script or declared with nginx's `env`;
- every service has a health check, and it probes what the stack's health function
  probes (same port and path, redis PING, SELECT 1 as the app's user).

Run by scripts/check.sh with the venv's Python (ruamel.yaml); exit 1 on any mismatch.
"""

import re
import sys
import tomllib
from pathlib import Path

from ruamel.yaml import YAML

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = "docker-compose.yml"

# The stack's parts and the compose services that run the same thing.
SERVICE_OF_PART = {
    "redis": "redis",
    "mysql": "mysql",
    "namesrv": "rocketmq-namesrv",
    "broker": "rocketmq-broker",
    "core": "core",
    "paysim": "paysim",
    "edge": "edge",
}

# Where the two stacks cannot probe the same thing, what compose probes instead, and why.
PROBE_EXCEPTIONS = {
    "broker": (
        lambda settings: {("tcp", settings["BROKER_PORT"])},
        "the image's Apache RocketMQ broker has no health endpoint (the local rocketmq-rust "
        "broker's /readyz on BROKER_PORT+3), so compose probes its listen port BROKER_PORT",
    ),
}

# Ports a client uses when none is given.
CLIENT_DEFAULT_PORT = {"redis-cli": "6379", "mysql": "3306", "mariadb": "3306"}

errors = {}


def fail(where, message):
    errors.setdefault(where, message)  # the first mismatch found in each place


# ------------------------------------------------------------------ the local stack
def stack_settings(text):
    """NAME=${NAME:-default} and NAME="value" assignments at the top level of stack.sh."""
    settings = {}
    for m in re.finditer(r'^([A-Z][A-Z0-9_]*)=(?:\$\{\1:-([^}]*)\}|"([^"$]*)")\s*(?:#.*)?$', text, re.M):
        settings[m[1]] = m[2] if m[2] is not None else m[3]
    return settings


def shell_function(text, name):
    """The body of `name() { … }` in stack.sh, continuation lines joined."""
    m = re.search(rf"^{re.escape(name)}\(\) \{{(.*?)\}}\s*(?:#.*)?$", text, re.M | re.S)
    if not m:
        return None
    return re.sub(r"\\\n\s*", " ", m[1])


def part_ports(text, settings):
    """Each part's port variables, as stack.sh's port_of() lists them."""
    body = shell_function(text, "port_of") or ""
    ports = {}
    for m in re.finditer(r'(\w+)\) echo "([^"]*)"', body):
        ports[m[1]] = {v: settings[v] for v in re.findall(r"\$(\w+)", m[2]) if v in settings}
    return ports


def resolve(text, values):
    """$NAME, ${NAME} and compose's $$NAME replaced by their values, where known."""
    def value(m):
        return values.get(m[1], m[0])
    return re.sub(r"\$\$?\{?(\w+)\}?", value, text)


# ------------------------------------------------------------------ config/stampede.toml
def documented_settings(text):
    """(section, key) -> default, for every key the file sets or documents in a comment."""
    settings = {}
    for section, table in tomllib.loads(text).items():
        for key, value in table.items():
            settings[(section, key)] = str(value)
    section = None
    for line in text.splitlines():
        if m := re.match(r"^\[(\w+)\]", line):
            section = m[1]
        elif m := re.match(r'^#\s*([a-z_]+)\s*=\s*"?([^"]*)"?\s*$', line):
            settings.setdefault((section, m[1]), m[2])
    return settings


def toml_key(env_key):
    """STAMPEDE_SECTION__KEY -> (section, key); the core's config::Environment mapping."""
    section, _, key = env_key.removeprefix("STAMPEDE_").partition("__")
    return section.lower(), key.lower()


def ports_in(value):
    return set(re.findall(r"[\w\].-]:(\d+)\b", value))


# ------------------------------------------------------------------ health probes
def probes(command):
    """What a health command checks, the same shape for stack.sh and compose."""
    found = set()
    for port, path in re.findall(r"https?://127\.0\.0\.1:(\d+)(/[^\s\"')]*)", command):
        found.add(("http", port, path))
    for port in re.findall(r'port_open "?(\d+)|/dev/tcp/127\.0\.0\.1/(\d+)', command):
        found.add(("tcp", port[0] or port[1]))
    if re.search(r"\bredis-cli\b.*\bping\b", command):
        port = re.search(r'(?<![\w-])-p\s*"?(\d+)', command)
        found.add(("redis PING", port[1] if port else CLIENT_DEFAULT_PORT["redis-cli"]))
    if m := re.search(r"\b(mysql|mariadb)\b.*?-e\s*'SELECT 1'\s+\"?([\w-]+)", command):
        user = re.search(r'(?<![\w-])-u\s*"?([\w.-]+)', command)
        port = re.search(r'(?<![\w-])-P\s*"?(\d+)', command)
        found.add(("SELECT 1", f"user {user[1] if user else '?'}", f"database {m[2]}",
                   port[1] if port else CLIENT_DEFAULT_PORT[m[1]]))
    return found


def show(found):
    return ", ".join(" ".join(p) for p in sorted(found)) or "nothing it recognises"


def healthcheck_command(service):
    test = (service.get("healthcheck") or {}).get("test")
    if isinstance(test, list):
        return " ".join(str(t) for t in test[1:]) if test and test[0] != "NONE" else None
    return test


# ------------------------------------------------------------------ the checks
def check_parts(services, stack_parts):
    for part in stack_parts:
        if part not in SERVICE_OF_PART:
            fail("scripts/check_compose.py", f"stack part {part!r} has no entry in SERVICE_OF_PART")
        elif SERVICE_OF_PART[part] not in services:
            fail(COMPOSE, f"no service {SERVICE_OF_PART[part]!r} for the stack's part {part!r}")
    for name in services:
        if name not in SERVICE_OF_PART.values():
            fail(COMPOSE, f"service {name!r} runs no part of the local stack (PARTS_DEFAULT)")


def strings_of(service):
    """Every string a service is configured with, where it is."""
    for field in ("command", "entrypoint"):
        value = service.get(field)
        for s in value if isinstance(value, list) else [value] if value else []:
            yield field, str(s)
    for key, value in environment(service).items():
        yield f"environment.{key}", value
    if command := healthcheck_command(service):
        yield "healthcheck", command


def environment(service):
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(e.partition("=")[::2] for e in env)
    return {k: "" if v is None else str(v) for k, v in env.items()}


def check_ports(services, settings, ports_of_part, core_env, documented):
    part_of_service = {s: p for p, s in SERVICE_OF_PART.items()}
    service_ports = {s: ports_of_part.get(p, {}) for s, p in part_of_service.items()}
    host_ref = re.compile(
        r"(?<![\w.-])(" + "|".join(map(re.escape, sorted(services, key=len, reverse=True))) + r"):(\d+)\b")

    for name, service in services.items():
        here = f"{COMPOSE} services.{name}"
        # <service>:<port> anywhere: the port that service's part listens on.
        for field, value in strings_of(service):
            for target, port in host_ref.findall(value):
                wanted = service_ports.get(target, {})
                if wanted and port not in wanted.values():
                    fail(f"{here}.{field}", f"{target}:{port}, but the stack's {part_of_service[target]} "
                         f"listens on {describe(wanted)}")
        env = environment(service)
        for key, value in env.items():
            # The edge's EDGE_PORT, CORE_PORT, …: the stack's variables of the same name.
            if key.endswith("_PORT") and key in settings and value != settings[key]:
                fail(f"{here}.environment.{key}", f"{value}, but scripts/stack.sh defaults {key} to {settings[key]}")
            # CORE_HOST, REDIS_HOST, …: a service whose part has that port.
            if key.endswith("_HOST"):
                port_var = key.removesuffix("_HOST") + "_PORT"
                if value not in services:
                    fail(f"{here}.environment.{key}", f"{value!r} is not a service")
                elif port_var in settings and port_var not in service_ports.get(value, {}):
                    fail(f"{here}.environment.{key}", f"service {value!r} does not listen on {port_var}")
        # The core's addresses: the stack's core_env, its ports, and stampede.toml's defaults.
        for key, stack_value in core_env.items():
            port_vars = [v for v in re.findall(r"\$(\w+_PORT)\b", stack_value) if v in settings]
            if key not in env or not port_vars:
                continue
            wanted = {settings[v] for v in port_vars}
            if ports_in(env[key]) != wanted:
                fail(f"{here}.environment.{key}", f"{env[key]}, but the local stack uses port "
                     f"{' '.join(sorted(wanted))} ({' '.join(port_vars)})")
        for entry in service.get("ports") or []:
            check_published(here, entry, service_ports.get(name, {}))

    for key, stack_value in core_env.items():
        port_vars = [v for v in re.findall(r"\$(\w+_PORT)\b", stack_value) if v in settings]
        default = documented.get(toml_key(key))
        if port_vars and default is not None and ports_in(default) != {settings[v] for v in port_vars}:
            section, name = toml_key(key)
            fail(f"config/stampede.toml [{section}] {name}", f"{default!r}, but scripts/stack.sh "
                 f"defaults {' '.join(port_vars)} to {' '.join(settings[v] for v in port_vars)}")

    broker_conf = (ROOT / "deploy/broker.conf").read_text()
    listen = re.search(r"^listenPort\s*=\s*(\d+)", broker_conf, re.M)
    if not listen or listen[1] != settings["BROKER_PORT"]:
        fail("deploy/broker.conf listenPort", f"{listen and listen[1]}, but scripts/stack.sh defaults "
             f"BROKER_PORT to {settings['BROKER_PORT']}")
    broker_ip = re.search(r"^brokerIP1\s*=\s*(\S+)", broker_conf, re.M)
    if broker_ip and broker_ip[1] not in services:
        fail("deploy/broker.conf brokerIP1", f"{broker_ip[1]!r} is not a service")


def describe(ports):
    return " ".join(f"{v} ({k})" for k, v in ports.items())


def check_published(here, entry, wanted):
    if isinstance(entry, dict):
        ip, host, inside = entry.get("host_ip"), entry.get("published"), entry.get("target")
    else:
        m = re.fullmatch(r"(?:(\d+\.\d+\.\d+\.\d+):)?(?:(\d+):)?(\d+)(?:/\w+)?", str(entry))
        if not m:
            fail(f"{here}.ports", f"{entry!r}: not a port this check understands")
            return
        ip, host, inside = m.groups()
    host, inside = str(host), str(inside)
    if ip != "127.0.0.1":
        fail(f"{here}.ports", f"{entry!r} is published on {ip or 'every address'}, not 127.0.0.1")
    elif host != inside:
        fail(f"{here}.ports", f"{entry!r} is published as {host if host != 'None' else 'a random port'}, "
             f"not as the port inside ({inside})")
    if inside not in wanted.values():
        fail(f"{here}.ports", f"{entry!r}: the stack's part listens on {describe(wanted) or 'no port'}")


def check_environment_keys(services, documented):
    nginx_env = set()
    for conf in sorted((ROOT / "openresty/conf").glob("*.conf")):
        nginx_env |= set(re.findall(r"^\s*env\s+(\w+)\s*;", conf.read_text(), re.M))
    for name, service in services.items():
        here = f"{COMPOSE} services.{name}.environment"
        script = entrypoint_script(service)
        for key in environment(service):
            if key.startswith("STAMPEDE_") and "__" in key:
                section, setting = toml_key(key)
                if (section, setting) not in documented:
                    fail(f"{here}.{key}", f"config/stampede.toml documents no [{section}] {setting}")
            elif key.startswith("STAMPEDE_") and key not in nginx_env:
                fail(f"{here}.{key}", "not a core setting (STAMPEDE_<SECTION>__<KEY>) and not "
                     "declared with `env` in openresty/conf")
            elif script is not None and not key.startswith("STAMPEDE_") \
                    and not re.search(rf"\$\{{?{key}\b", script[1]):
                fail(f"{here}.{key}", f"not read by its entrypoint {script[0]}")


def entrypoint_script(service):
    """(path, text) of a service's entrypoint when it is a script of this repository."""
    entry = service.get("entrypoint")
    first = entry[0] if isinstance(entry, list) and entry else entry
    for volume in service.get("volumes") or []:
        source, _, rest = str(volume).partition(":")
        target = rest.split(":")[0]
        if source.startswith("./") and isinstance(first, str) and first.startswith(target + "/"):
            path = source[2:] + first[len(target):]
            return path, (ROOT / path).read_text()
    return None


def check_health(services, stack_text, settings):
    for part, name in SERVICE_OF_PART.items():
        service = services.get(name)
        if service is None:
            continue
        here = f"{COMPOSE} services.{name}.healthcheck"
        command = healthcheck_command(service)
        if not command:
            fail(here, "missing: every service needs a health check (depends_on waits on them)")
            continue
        theirs = probes(resolve(command, environment(service)))
        if part in PROBE_EXCEPTIONS:
            wanted, why = PROBE_EXCEPTIONS[part]
            ours = wanted(settings)
        else:
            body = shell_function(stack_text, f"health_{part}")
            if body is None:
                fail("scripts/stack.sh", f"no health_{part} function")
                continue
            ours, why = probes(resolve(body, settings)), None
            if not ours:
                fail(f"scripts/stack.sh health_{part}", "probes nothing this check recognises; teach probes()")
                continue
        if theirs != ours and why:
            fail(here, f"probes {show(theirs)}, not {show(ours)}: {why}")
        elif theirs != ours:
            fail(here, f"probes {show(theirs)}, but the local stack's health_{part} probes {show(ours)}")


def main():
    compose = YAML(typ="safe", pure=True).load((ROOT / COMPOSE).read_text())
    services = compose.get("services") or {}
    # stack.sh and the files it sources (scripts/stack/*.sh: the parts' functions).
    stack_text = "\n".join(
        p.read_text() for p in [ROOT / "scripts/stack.sh", *sorted((ROOT / "scripts/stack").glob("*.sh"))]
    )
    settings = stack_settings(stack_text)
    ports_of_part = part_ports(stack_text, settings)
    core_env = dict(re.findall(r"^\s*export (STAMPEDE_\w+)=(.*)$", shell_function(stack_text, "core_env") or "", re.M))
    documented = documented_settings((ROOT / "config/stampede.toml").read_text())

    check_parts(services, settings.get("PARTS_DEFAULT", "").split())
    check_ports(services, settings, ports_of_part, core_env, documented)
    check_environment_keys(services, documented)
    check_health(services, stack_text, settings)

    for where, message in errors.items():
        print(f"{where}: {message}", file=sys.stderr)
    if errors:
        print(f"{COMPOSE} disagrees with the local stack in {len(errors)} place(s)", file=sys.stderr)
        return 1
    print(f"{COMPOSE} agrees with scripts/stack.sh and config/stampede.toml "
          f"({len(services)} services: ports, environment keys, health checks)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
