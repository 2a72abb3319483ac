"""Settings (LATTICE_* via pydantic-settings) and the Celery configuration, no services."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from lattice_client.celery_config import celery_config, make_celery_app, queue_name
from lattice_client.settings import DEFAULT_BROKER_URL, LatticeSettings, get_settings

ENV_NAMES = [
    "LATTICE_BROKER_URL",
    "LATTICE_MAILBOX_URL",
    "LATTICE_KEY_PREFIX",
    "LATTICE_LEASE_SECONDS",
    "LATTICE_MAX_ATTEMPTS",
    "LATTICE_REAPER_INTERVAL_SECONDS",
    "LATTICE_MAX_MESSAGE_BYTES",
    "LATTICE_MAX_RUN_EVENTS",
]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)


def test_defaults():
    s = get_settings()
    assert s.broker_url == DEFAULT_BROKER_URL == "redis://127.0.0.1:6379/0"
    assert s.mailbox_url == s.broker_url
    assert s.key_prefix == "lattice"
    assert s.lease_seconds == 30.0 and isinstance(s.lease_seconds, float)
    assert s.max_attempts == 3
    assert s.reaper_interval_seconds == 5.0
    assert s.max_message_bytes == 1024 * 1024


def test_environment_variables_and_overrides(monkeypatch):
    monkeypatch.setenv("LATTICE_BROKER_URL", "redis://redis:6379/2")
    monkeypatch.setenv("LATTICE_KEY_PREFIX", "staging")
    monkeypatch.setenv("LATTICE_LEASE_SECONDS", "2.5")
    monkeypatch.setenv("LATTICE_MAX_ATTEMPTS", "5")
    s = get_settings()
    assert (s.broker_url, s.mailbox_url, s.key_prefix, s.lease_seconds, s.max_attempts) == (
        "redis://redis:6379/2",
        "redis://redis:6379/2",  # follows the broker
        "staging",
        2.5,
        5,
    )
    # keyword overrides win; None means "not given"
    t = get_settings(key_prefix="other", broker_url=None)
    assert (t.key_prefix, t.broker_url) == ("other", "redis://redis:6379/2")
    monkeypatch.setenv("LATTICE_MAILBOX_URL", "sqlite:///tmp/m.db")
    assert get_settings().mailbox_url == "sqlite:///tmp/m.db"


def test_with_overrides_keeps_the_mailbox_following_the_broker():
    s = get_settings()
    moved = s.with_overrides(broker_url="redis://elsewhere:6379/1")
    assert moved.mailbox_url == "redis://elsewhere:6379/1"
    pinned = get_settings(mailbox_url="postgresql://db/x").with_overrides(broker_url="redis://h/0")
    assert pinned.mailbox_url == "postgresql://db/x"
    assert s.with_overrides() is s


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("key_prefix", ""),
        ("key_prefix", "has space"),
        ("key_prefix", "a:b"),
        ("key_prefix", "{x}"),
        ("lease_seconds", 0),
        ("lease_seconds", -1),
        ("max_attempts", 0),
        ("reaper_interval_seconds", 0),
        ("max_message_bytes", 0),
        ("broker_url", "kafka://localhost"),
        ("broker_url", "not a url"),
    ],
)
def test_bad_values_are_refused_naming_the_field(field, value):
    with pytest.raises(ValidationError) as info:
        get_settings(**{field: value})
    assert info.value.errors()[0]["loc"] == (field,)


def test_bad_environment_value_is_refused(monkeypatch):
    monkeypatch.setenv("LATTICE_MAX_ATTEMPTS", "many")
    with pytest.raises(ValueError, match="max_attempts"):
        get_settings()


def test_unknown_setting_is_refused():
    with pytest.raises(ValidationError, match="bogus"):
        get_settings(bogus=1)


def test_every_field_documents_itself():
    for name, info in LatticeSettings.model_fields.items():
        assert info.description and f"LATTICE_{name.upper()}" in info.description, name


def test_queue_names():
    assert queue_name("lattice", "example", "lead") == "lattice.example.lead"
    assert queue_name("p", "team", "searcher") == "p.team.searcher"
    assert queue_name("p", "team") == "p.team.lead"
    for bad in [("", "t", "m"), ("p", "", "m"), ("p", "t", ""), ("p", "a b", "m")]:
        with pytest.raises(ValueError):
            queue_name(*bad)


def test_celery_app_configuration():
    app = make_celery_app(get_settings(key_prefix="dep1", broker_url="redis://10.0.0.5:6379/3"))
    conf = app.conf
    assert conf.broker_url == "redis://10.0.0.5:6379/3"
    assert conf.task_serializer == "json"
    assert conf.accept_content == ["json"]
    assert conf.result_accept_content == ["json"]
    assert conf.task_ignore_result is True
    assert conf.task_acks_late is True
    assert conf.task_reject_on_worker_lost is True
    assert conf.worker_prefetch_multiplier == 1
    assert conf.worker_send_task_events is True
    assert conf.task_send_sent_event is True
    assert conf.broker_connection_retry_on_startup is True
    assert conf.broker_transport_options["global_keyprefix"] == "dep1:"
    assert conf.task_default_queue == "dep1.default"
    assert conf.control_exchange == "dep1"
    assert conf.event_exchange == "dep1.celeryev"
    assert app.main == "lattice"
    # no task bodies: the client only sends by name
    assert not [name for name in app.tasks if name.startswith("lattice.")]


def test_config_follows_the_environment_when_no_settings_are_given(monkeypatch):
    monkeypatch.setenv("LATTICE_KEY_PREFIX", "from-env")
    assert make_celery_app().conf.broker_transport_options["global_keyprefix"] == "from-env:"
    assert celery_config(get_settings())["task_default_queue"] == "from-env.default"


AMQP = "amqp://guest:guest@127.0.0.1:5672//"


def test_a_rabbitmq_broker_keeps_runs_and_registry_on_the_mailbox_redis():
    settings = get_settings(broker_url=AMQP, mailbox_url="redis://10.0.0.7:6379/2")
    assert settings.broker_url == AMQP
    assert settings.state_url == "redis://10.0.0.7:6379/2"
    # on Redis the runs stay on the broker, whatever the mailboxes are
    assert get_settings(broker_url="redis://10.0.0.5:6379/3", mailbox_url="sqlite:///x.db").state_url == (
        "redis://10.0.0.5:6379/3"
    )
    # a RabbitMQ broker is never the mailboxes' default, also when it replaces a Redis one
    with pytest.raises(ValidationError) as info:
        get_settings(broker_url=AMQP)
    assert info.value.errors()[0]["loc"] == ("mailbox_url",)
    assert "is RabbitMQ: mailbox_url must name the Redis" in str(info.value)
    with pytest.raises(ValidationError, match="mailbox_url must name the Redis"):
        get_settings().with_overrides(broker_url=AMQP)
    for mailbox in ("sqlite:///x.db", "postgresql://h/db", "memory://", AMQP):
        with pytest.raises(ValidationError, match="must then be a Redis URL"):
            get_settings(broker_url=AMQP, mailbox_url=mailbox)


def test_celery_configuration_on_rabbitmq_uses_quorum_queues():
    conf = make_celery_app(
        get_settings(key_prefix="dep2", broker_url=AMQP, mailbox_url="redis://h:6379/0")
    ).conf
    assert conf.broker_url == AMQP
    assert conf.task_default_queue_type == "quorum"
    assert conf.task_create_missing_queue_type == "quorum"
    assert conf.worker_detect_quorum_queues is True
    assert conf.broker_transport_options == {"confirm_publish": True}  # no Redis key prefix options
    assert conf.broker_transport is None  # kombu's own amqp transport, not our Redis one
    assert conf.task_acks_late is True and conf.task_reject_on_worker_lost is True
    # the names carry the prefix on a shared vhost as they do on a shared Redis
    assert (conf.task_default_queue, conf.control_exchange, conf.event_exchange) == (
        "dep2.default",
        "dep2",
        "dep2.celeryev",
    )


CLUSTER = "redis+cluster://:s3cret@10.0.0.1:7000,10.0.0.2:7001"


def test_a_redis_cluster_holds_mailboxes_runs_and_registry_and_is_refused_as_broker():
    settings = get_settings(mailbox_url=CLUSTER)
    assert settings.broker_url == "redis://127.0.0.1:6379/0"  # Celery stays on one Redis
    assert settings.state_url == CLUSTER  # runs and the registry follow the mailboxes onto the cluster
    on_rabbit = get_settings(broker_url=AMQP, mailbox_url=CLUSTER)
    assert on_rabbit.state_url == CLUSTER
    assert "s3cret" not in repr(on_rabbit) and "10.0.0.2:7001" in repr(on_rabbit)
    with pytest.raises(ValidationError) as info:
        get_settings(broker_url=CLUSTER)
    assert info.value.errors()[0]["loc"] == ("broker_url",)
    assert "Celery's Redis transport cannot use" in str(info.value) and "mailbox_url" in str(info.value)
    assert "s3cret" not in str(info.value)


def test_cluster_urls_parse_into_startup_nodes_and_bad_ones_are_refused():
    from lattice_mailbox.connections import cluster_nodes, is_cluster_url

    assert cluster_nodes("redis+cluster://u:p%40ss@h1:7000,[::1]:7001/0") == (
        [("h1", 7000), ("::1", 7001)],
        {"ssl": False, "username": "u", "password": "p@ss"},
    )
    assert cluster_nodes("rediss+cluster://h:1")[1] == {"ssl": True}
    assert is_cluster_url("redis+cluster://h:1") and not is_cluster_url("redis://h:1/0")
    for bad, why in (
        ("redis+cluster://h1", "needs host:port"),
        ("redis+cluster://h1:7000,", "needs host:port"),
        ("redis+cluster://:s3cret@h1:7000/2", "only database 0"),
        ("redis+cluster://h1:7000?password=s3cret", "no query string"),
    ):
        with pytest.raises(ValueError, match=why) as info:
            cluster_nodes(bad)
        assert "s3cret" not in str(info.value)
