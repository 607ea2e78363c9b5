"""The ``fanout-sink`` command: one entry point for operators, the demo and the local stack."""

from __future__ import annotations

import argparse
import faulthandler
import json
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fanout_sink import jars, logs
from fanout_sink.errors import FanoutSinkError, StackError
from fanout_sink.jars import JarSet

if TYPE_CHECKING:
    from fanout_sink.config.models import SinkConfig


def _stack(args: argparse.Namespace) -> int:
    from fanout_sink.devtools.stack import daemon

    work_dir = Path(args.dir) if args.dir else daemon.default_dir()
    if args.action == "serve":
        from fanout_sink.devtools.stack.service import serve

        return serve(daemon.SERVICES[args.name].build(work_dir, args.port, args.host), args.name)
    if args.action == "up":
        state, started = daemon.up(work_dir, args.port)
        extras = daemon.up_extras(work_dir, args.with_)
        if args.json:
            answer: dict[str, Any] = {
                "bootstrap.servers": state.bootstrap_servers,
                "started": started,
                "pid": state.pid,
            }
            for name, extra, extra_started in extras:
                settings = daemon.SERVICES[name].client_settings(extra)
                answer[name] = {"started": extra_started, "pid": extra.pid, **settings}
            print(json.dumps(answer))
        else:
            verb = "started" if started else "already running"
            print(f"Kafka broker {verb} (pid {state.pid}, log {state.log_file})", file=sys.stderr)
            print(f"bootstrap.servers={state.bootstrap_servers}")
            for name, extra, extra_started in extras:
                verb = "started" if extra_started else "already running"
                print(
                    f"{daemon.SERVICES[name].title} {verb} (pid {extra.pid}, log {extra.log_file})",
                    file=sys.stderr,
                )
                settings = daemon.SERVICES[name].client_settings(extra)
                print(f"{name}: " + "  ".join(f"{key}={value}" for key, value in settings.items()))
            if any(daemon.SERVICES[name].credentials for name, _, _ in extras):
                print(f"credentials: `fanout-sink stack status --json --dir {work_dir}`", file=sys.stderr)
        return 0
    if args.action == "down":
        stopped = daemon.down(work_dir, args.with_ or None)
        for name, was_running in stopped.items():
            if was_running or args.with_:
                verb = "stopped" if was_running else f"was not running (state folder {work_dir})"
                print(f"{daemon.SERVICES[name].title} {verb}", file=sys.stderr)
        if not any(stopped.values()) and not args.with_:
            print(f"nothing of the stack in {work_dir} was running", file=sys.stderr)
        return 0
    report = daemon.status(work_dir)
    if args.json:
        print(json.dumps(report))
        return 0 if report["running"] else 1
    if report["running"]:
        print(f"running  bootstrap.servers={report['bootstrap.servers']}  pid={report['pid']}")
    else:
        print(f"not running (state folder {work_dir}); start it with `fanout-sink stack up`")
    for name, service in report.get("services", {}).items():
        settings = daemon.SERVICES[name].client_settings(daemon.saved_state(work_dir, name))
        shown = "  ".join(f"{key}={value}" for key, value in settings.items())
        print(f"{name}: {'running' if service['running'] else 'stopped'}  {shown}  pid={service['pid']}")
    return 0 if report["running"] else 1


def _demo(args: argparse.Namespace) -> int:
    from fanout_sink.devtools import demo

    config = Path(args.config) if args.config else None
    return demo.run(
        Path(args.dir), records=args.records, bootstrap_servers=args.bootstrap_servers, config_path=config
    )


def _setting(item: str) -> tuple[str, str]:
    """``--conf``'s argparse type (the config package is imported only when the option is given)."""
    from fanout_sink.config.loading import key_value

    return key_value(item)


def _add_conf(parser: argparse.ArgumentParser) -> None:
    """``--conf KEY=VALUE``: the same Spark-property option on every command that starts Spark."""
    parser.add_argument(
        "--conf", action="append", default=[], type=_setting, metavar="KEY=VALUE",
        help="a Spark property, repeatable",
    )  # fmt: skip


def _positive(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return int(text)


def _names(allowed: tuple[str, ...]) -> Callable[[str], list[str]]:
    """An argparse type: a comma-separated list of names out of ``allowed``."""

    def parse(text: str) -> list[str]:
        names = [name.strip() for name in text.split(",") if name.strip()]
        unknown = [name for name in names if name not in allowed]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {unknown}: choose from {','.join(allowed)}")
        return names

    return parse


def _import_connect(args: argparse.Namespace) -> int:
    from fanout_sink.config.loading import load_config
    from fanout_sink.connect_import import takeover, translator

    props = translator.load_connector(args.connector)
    imported = translator.translate(props, bootstrap=args.bootstrap_servers, sink_name=args.name)
    text = imported.yaml()
    if args.out:
        Path(args.out).write_text(text)
        print(f"wrote {args.out} (sink {imported.sink['name']!r})", file=sys.stderr)
    else:
        sys.stdout.write(text)
    if imported.uncarried:
        print(f"keys not carried ({len(imported.uncarried)}):", file=sys.stderr)
        for item in imported.uncarried:
            print(f"  {item.key}: {item.reason}", file=sys.stderr)
    if imported.variables:
        print(
            "secrets and Connect config-provider values are ${VAR} references in the YAML; "
            "set them before `fanout-sink run`:",
            file=sys.stderr,
        )
        for var, key in imported.variables.items():
            print(f"  {var}: the value of {key}", file=sys.stderr)
    if not args.take_over:
        return 0
    if not args.out:
        raise FanoutSinkError("--take-over needs --out: the sink it seeds is the YAML written there")
    taken = takeover.take_over(imported, load_config(args.out))
    for (topic, part), offset in sorted(taken.positions.items()):
        print(
            f"took over {topic}[{part}] at offset {offset} (group {imported.commit_group!r})",
            file=sys.stderr,
        )
    for topic, part in taken.unstarted:
        print(
            f"{topic}[{part}]: the connector delivered nothing from it; starts at source.starting-offsets",
            file=sys.stderr,
        )
    print(f"next: fanout-sink run --config {args.out}", file=sys.stderr)
    return 0


def _log_to_stderr(log_format: logs.LogFormat = "plain", level: logs.LogLevel = "INFO") -> None:
    """The sink's own log on stderr (see :func:`fanout_sink.logs.configure`)."""
    logs.configure(log_format, level)


def _logging_options(config: SinkConfig, args: argparse.Namespace) -> SinkConfig:
    """The config with ``--log-format``/``--log-level`` over its ``logging:`` section: the executors
    log as the config they receive says."""
    chosen = {key: value for key, value in (("format", args.log_format), ("level", args.log_level)) if value}
    return config.model_copy(update={"logging": config.logging.model_copy(update=chosen)})


def _run(args: argparse.Namespace) -> int:
    from fanout_sink.refused_imports import refusing

    # Before the app's modules load: the driver never needs pandas (35 MB; refused_imports.py).
    with refusing("the driver Python of fanout-sink run (fanout_sink/refused_imports.py)"):
        return _run_app(args)


def _run_app(args: argparse.Namespace) -> int:
    from fanout_sink.config.fields import parse_duration
    from fanout_sink.config.loading import load_config
    from fanout_sink.spark.app import RunOptions, SinkApp

    # `kill -USR1 <pid>` prints every thread's stack: the first question about a sink that seems stuck.
    # To the process's own stderr: sys.stderr may be a stand-in without a file descriptor.
    if sys.__stderr__ is not None:
        faulthandler.register(signal.SIGUSR1, file=sys.__stderr__, all_threads=True)
    config = _logging_options(load_config(args.config), args)
    _log_to_stderr(config.logging.format, config.logging.level)
    options = RunOptions(
        master=args.master,
        available_now=args.available_now,
        trigger_interval=parse_duration(args.trigger_interval) if args.trigger_interval else None,
        max_offsets_per_trigger=args.max_offsets_per_trigger,
        spark_conf=tuple(args.conf),
    )
    return SinkApp(config, options).run()


def _status(args: argparse.Namespace) -> int:
    from fanout_sink.status import run as status_run

    text, status = status_run(Path(args.config), args.json)
    for fault in status.faults:
        print(fault.line(), file=sys.stderr)
    print(text)
    return status.exit_code


def _validate(args: argparse.Namespace) -> int:
    from fanout_sink.validate import validate

    report = validate(Path(args.config), offline=args.offline)
    if args.json:
        print(json.dumps(report.as_json(), indent=2))
    else:
        out, err = report.lines()
        for line in err:
            print(line, file=sys.stderr)
        for line in out:
            print(line)
    return 0 if report.ok else 2


def _route(args: argparse.Namespace) -> int:
    from fanout_sink.config.loading import load_config
    from fanout_sink.route.preview import preview_records
    from fanout_sink.route.report import as_json, render_text

    config = load_config(args.config)
    _log_to_stderr("plain", "WARNING")
    found = preview_records(config, Path(args.sample) if args.sample else None, args.topic, args.last)
    print(json.dumps(as_json(found), indent=2) if args.format == "json" else render_text(found))
    return 2 if found.stops else 0


def _maintain(args: argparse.Namespace) -> int:
    from fanout_sink.catalog import load_catalog
    from fanout_sink.config.fields import parse_duration
    from fanout_sink.config.loading import load_config
    from fanout_sink.maintenance.report import render_text
    from fanout_sink.spark import session
    from fanout_sink.spark.maintenance import maintain_run, select_tables
    from fanout_sink.status import broker_fault

    config = load_config(args.config)
    if args.max_duration:
        bounded = config.maintenance.model_copy(update={"max_duration": parse_duration(args.max_duration)})
        config = config.model_copy(update={"maintenance": bounded})
    _log_to_stderr(config.logging.format, config.logging.level)
    # A --table that is not the sink's fails here, before a Spark session starts.
    tables = select_tables(load_catalog(config.catalog, create=False), config.name, args.table or None)
    # Orphan removal reads the control topic: a broker that is down is one line, before Spark starts.
    kafka_fault = broker_fault(config)
    if kafka_fault is not None:
        print(
            f"fanout-sink maintain: {kafka_fault.cause}; nothing was maintained (orphan removal reads the "
            f"control topic); fix: {kafka_fault.fix}",
            file=sys.stderr,
        )
        return 3
    spark = session.LazySession(  # started only for a table that needs Spark's procedures
        lambda: session.build_spark_session(
            config.catalog,
            master=args.master or config.spark.master,
            app_name=f"{config.name}-maintenance",
            extra_conf=dict(args.conf),
        )
    )
    try:
        run = maintain_run(spark, config, tables, args.dry_run)
    finally:
        spark.stop()
    print(render_text(run.results))
    print(run.line())
    return 0 if all(result.ok for result in run.results) else 1


def _sql(args: argparse.Namespace) -> int:
    from fanout_sink.config.loading import load_config
    from fanout_sink.spark import sql_shell

    config = load_config(args.config)
    return sql_shell.run(
        config,
        execute_text=args.execute,
        script=Path(args.file) if args.file else None,
        output=args.format,
        master=args.master,
        extra_conf=dict(args.conf),
        verbose=args.verbose,
        consistent=args.consistent,
    )


def _pack(args: argparse.Namespace) -> int:
    from fanout_sink.spark import shipping

    print(shipping.build(Path(args.output) if args.output else None))
    return 0


JAR_SETS = ("spark-connectors", "spark-object-store", "kafka-broker", "s3proxy", "iceberg-rest")
"""The names ``fanout-sink jars --set`` takes; spelled out so that parsing a command imports no catalog."""


def jar_sets() -> dict[str, JarSet]:
    """Every jar set the product and the stack's servers run on (an image fetches them at build)."""
    from fanout_sink.devtools.stack.broker import KAFKA_BROKER
    from fanout_sink.devtools.stack.object_store import S3PROXY
    from fanout_sink.devtools.stack.rest_catalog import ICEBERG_REST
    from fanout_sink.spark.session import SPARK_CONNECTORS, SPARK_OBJECT_STORE

    sets = (SPARK_CONNECTORS, SPARK_OBJECT_STORE, KAFKA_BROKER, S3PROXY, ICEBERG_REST)
    return {jar_set.name: jar_set for jar_set in sets}


def _jars(args: argparse.Namespace) -> int:
    sets = jar_sets()
    names = JAR_SETS if args.all else args.set
    paths = [str(path) for name in names for path in jars.jars(sets[name])]
    print(",".join(paths) if args.comma else "\n".join(paths))
    return 0


DESCRIPTION = (
    "Exactly-once fan-out of Kafka topics into many Apache Iceberg tables, on Spark. "
    "Check a config with 'fanout-sink validate --config sink.yaml', start it with "
    "'fanout-sink run --config sink.yaml', watch it with 'fanout-sink status --config sink.yaml'."
)
"""The top-level help: plain text (the module docstring is reST, for developers)."""


def version_text() -> str:
    """This package's version and those of the engines it runs on (``fanout-sink --version``)."""
    from importlib import metadata

    import confluent_kafka

    def version(package: str) -> str:
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            return "not installed"

    return (
        f"fanout-sink {version('fanout-sink')}\n"
        f"PySpark {version('pyspark')}, PyIceberg {version('pyiceberg')}, confluent-kafka "
        f"{version('confluent-kafka')} (librdkafka {confluent_kafka.libversion()[0]}), "
        f"Python {sys.version.split()[0]}"
    )


class _Version(argparse.Action):
    """``--version``, computed only when asked (argparse's own would at every start)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        print(version_text())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fanout-sink", description=DESCRIPTION)
    parser.add_argument("--version", action=_Version, help="show the versions of fanout-sink and its engines")
    commands = parser.add_subparsers(dest="command", required=True)

    from fanout_sink.devtools.stack.daemon import EXTRAS, SERVICES

    stack = commands.add_parser("stack", help="the local Kafka broker (and storage servers) for development")
    stack_actions = stack.add_subparsers(dest="action", required=True)
    for action, text in (("up", "start in the background"), ("down", "stop"), ("status", "report")):
        sub = stack_actions.add_parser(action, help=f"{text} the stack's servers")
        sub.add_argument("--dir", help="state folder (default: ~/.cache/fanout-sink/stack)")
        sub.add_argument("--json", action="store_true", help="machine-readable output")
        if action == "up":
            sub.add_argument("--port", type=int, help="broker port (default: 9092 when free, else any)")
            sub.add_argument(
                "--with", dest="with_", type=_names(EXTRAS), default=[],
                help=f"also start these, comma-separated: {','.join(EXTRAS)}",
            )  # fmt: skip
        if action == "down":
            sub.add_argument(
                "--with", dest="with_", type=_names(tuple(SERVICES)), default=[],
                help=f"stop only these, comma-separated: {','.join(SERVICES)} (default: every one)",
            )  # fmt: skip
    serve = stack_actions.add_parser("serve", help="run one server in the foreground (SIGTERM stops it)")
    serve.add_argument("name", choices=list(SERVICES))
    serve.add_argument("--dir", help="state folder (default: ~/.cache/fanout-sink/stack)")
    serve.add_argument(
        "--port", type=int, help="port to listen on (default: the last one, else any free one)"
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 in containers)")
    stack.set_defaults(func=_stack)

    demo = commands.add_parser("demo", help="end to end on the embedded defaults, then show the tables")
    demo.add_argument("--dir", default="demo-data", help="where the demo catalog and warehouse live")
    demo.add_argument("--records", type=int, default=2000, help="sample events to produce")
    demo.add_argument("--bootstrap-servers", help="use this Kafka cluster instead of the local stack")
    demo.add_argument("--config", help="the sink YAML to run (default: routing/shop-demo.yaml)")
    demo.set_defaults(func=_demo)

    check = commands.add_parser(
        "validate",
        help="check a config as run would before starting (and tables against routes); creates nothing",
    )
    check.add_argument("--config", required=True, help="the sink's YAML file")
    check.add_argument("--json", action="store_true", help="machine-readable output")
    check.add_argument(
        "--offline",
        action="store_true",
        help="contact no broker, catalog or warehouse: the config and its tables' routes only (a build step)",
    )
    check.set_defaults(func=_validate)

    route = commands.add_parser(
        "route",
        help="which table each record would land in, with its columns, or why it is filtered or "
        "dead-lettered; writes nothing",
    )
    route.add_argument("--config", required=True, help="the sink's YAML file")
    records = route.add_mutually_exclusive_group(required=True)
    records.add_argument(
        "--sample", metavar="FILE", help="records from a JSON-lines file (one value, or envelope, per line)"
    )
    records.add_argument("--topic", help="records from this topic on the broker (nothing is committed)")
    route.add_argument(
        "--last", type=_positive, default=10, metavar="N",
        help="with --topic: the last N offsets of each partition (default 10)",
    )  # fmt: skip
    route.add_argument("--format", choices=("text", "json"), default="text", help="text (default) or JSON")
    route.set_defaults(func=_route)

    imp = commands.add_parser(
        "import-connect",
        help="a sink YAML from an Iceberg Kafka Connect sink's connector config (--take-over: its offsets)",
    )
    imp.add_argument(
        "connector", help="the connector's config: Connect's REST JSON, its config object, or .properties"
    )
    imp.add_argument("--out", help="write the YAML here (default: standard output)")
    imp.add_argument(
        "--bootstrap-servers",
        help="the brokers, when the connector's config lacks iceberg.kafka.bootstrap.servers",
    )
    imp.add_argument(
        "--name",
        help="the sink's name (default: the connector's); the connector's too when its config has none",
    )
    imp.add_argument(
        "--take-over",
        action="store_true",
        help=(
            "once the connector is stopped and its last commit completed, start the sink's partitions "
            "where its tables end"
        ),
    )
    imp.set_defaults(func=_import_connect)

    run = commands.add_parser("run", help="run the sink as a Spark Structured Streaming application")
    run.add_argument("--config", required=True, help="the sink's YAML file")
    run.add_argument("--master", help="Spark master (default: spark.master in the config, else local[*])")
    run.add_argument(
        "--available-now", action="store_true", help="process what is in the topics now, commit, exit"
    )
    run.add_argument(
        "--trigger-interval", help="micro-batch interval, e.g. 10s (default: spark.trigger-interval)"
    )
    run.add_argument("--max-offsets-per-trigger", type=int, help="cap on records per micro-batch")
    _add_conf(run)
    run.add_argument(
        "--log-format", choices=("plain", "json"), help="plain text or JSON lines (default: logging.format)"
    )
    run.add_argument(
        "--log-level", choices=("DEBUG", "INFO", "WARNING", "ERROR"), help="default: logging.level, INFO"
    )
    run.set_defaults(func=_run)

    status = commands.add_parser(
        "status",
        help="per table: last commit, VTTS, files, snapshots, last maintenance; per source partition: lag",
    )
    status.add_argument("--config", required=True, help="the sink's YAML file")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.set_defaults(func=_status)

    maintain = commands.add_parser(
        "maintain", help="compact, rewrite manifests, expire snapshots, remove orphans of the sink's tables"
    )
    maintain.add_argument("--config", required=True, help="the sink's YAML file")
    maintain.add_argument("--table", action="append", default=[], help="only this table, repeatable")
    maintain.add_argument("--dry-run", action="store_true", help="report what would be done, change nothing")
    maintain.add_argument(
        "--max-duration",
        help="start no new table after this long (e.g. 10m; overrides maintenance.max-duration); "
        "the tables that gain most go first",
    )
    maintain.add_argument(
        "--master", help="Spark master (default: spark.master in the config, else local[*])"
    )
    _add_conf(maintain)
    maintain.set_defaults(func=_maintain)

    sql = commands.add_parser(
        "sql",
        help="Spark SQL on the sink's catalog (same jars and settings as run); a prompt without -e or -f",
    )
    sql.add_argument("--config", required=True, help="the sink's YAML file (its catalog section is used)")
    given = sql.add_mutually_exclusive_group()
    given.add_argument(
        "-e", "--execute", metavar="SQL", help="run these statements (';'-separated), then exit"
    )
    given.add_argument("-f", "--file", metavar="FILE", help="run the statements in this file, then exit")
    sql.add_argument(
        "--format", choices=("table", "json", "csv"), default="table",
        help="an aligned table (default), JSON lines (one object per row) or CSV with a header",
    )  # fmt: skip
    sql.add_argument(
        "--master", help="Spark master (default: local[*]; the config's spark.master is not used)"
    )
    _add_conf(sql)
    sql.add_argument("--verbose", action="store_true", help="print the Python and Java stacks of an error")
    sql.add_argument(
        "--consistent", action="store_true",
        help="register each table of the sink as a view (orders, payments) at the newest round that "
        "every table holds, so a join never sees one table ahead of another",
    )  # fmt: skip
    sql.set_defaults(func=_sql)

    pack = commands.add_parser(
        "pack", help="build the Python environment a cluster's executors run (cached; prints its path)"
    )
    pack.add_argument("--output", help="also copy the pack here (for spark-submit --archives)")
    pack.set_defaults(func=_pack)

    jars_cmd = commands.add_parser("jars", help="fetch JVM jars from Maven Central (cached) and list them")
    jars_cmd.add_argument("--set", nargs="+", choices=JAR_SETS, default=["spark-connectors"])
    jars_cmd.add_argument(
        "--all", action="store_true", help="every jar set (what a parallel test run fetches before it starts)"
    )
    jars_cmd.add_argument(
        "--comma", action="store_true", help="one comma-separated line, as spark-submit --jars takes"
    )
    jars_cmd.set_defaults(func=_jars)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except StackError as exc:
        print(f"fanout-sink: {exc.cause}\n  fix: {exc.fix}", file=sys.stderr)
        if exc.details:
            print(exc.details, file=sys.stderr)
        return 2
    except FanoutSinkError as exc:
        print(f"fanout-sink: {exc}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
