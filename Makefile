# Two commands do all the set-up on a fresh machine:
#   make demo   run the harvester on the embedded default (SQLite + the embedded broker)
#   make test   start PostgreSQL, MariaDB and Apache Kafka, install Prometheus and Chromium
#               (.ci/tools), then run lint, docs and the test matrix (tox; environments chosen
#               by .ci/envs) against them, then alone the fault tests on make kafka-cluster
#
#   make kafka        Apache Kafka 4.x (KRaft, one JVM) on 127.0.0.1:$(KAFKA_PORT); no-op if it runs
#   make kafka-stop   stop it (its data stays)
#   make kafka-clean  stop it and delete its data
#
#   make kafka-cluster        three Apache Kafka nodes (replication 3, min.insync.replicas 2) on
#                             $(KAFKA_CLUSTER_PORTS); starts whichever nodes are down
#   make kafka-cluster-stop   stop them (their data stays)
#   make kafka-cluster-clean  stop them and delete their data
#   make schema-registry       a real schema registry (Apicurio Registry 3.3.3, its Confluent-compatible
#                              API) on 127.0.0.1:$(SCHEMA_REGISTRY_PORT); needs a Java 21+ under /usr/lib/jvm
#   make schema-registry-stop  stop it (its storage is in memory: the next start is empty)
#   make kafka-secure        the same Kafka secured: TLS (a CA made at start), SASL/SCRAM-SHA-512
#                            and ACLs enforced, on 127.0.0.1:$(KAFKA_SECURE_PORT); no-op if it runs.
#                            CA: .kafka/secure/ca.pem; super user: .kafka/secure/admin.properties
#   make kafka-secure-stop   stop it (its data, CA and users stay)
#   make kafka-secure-clean  stop it and delete its directory

PYTHON ?= python3
VENV   := .venv
STAMP  := $(VENV)/.installed-stamp

.PHONY: demo test lint docs clean kafka kafka-stop kafka-clean kafka-cluster kafka-cluster-stop kafka-cluster-clean kafka-secure kafka-secure-stop kafka-secure-clean schema-registry schema-registry-stop

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "pyharvest needs Python 3.11 or newer")'
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip setuptools wheel
	$(VENV)/bin/python -m pip install --quiet -e '.[test,embedded,postgresql,mysql]'
	@touch $@

demo: $(STAMP)
	$(VENV)/bin/reaper demo $(ARGS)

# Two environments at a time: most of a run waits on the broker's group joins and on child
# processes, not on the CPU (sequentially it took 27-32 minutes, against CI's 30). The
# environments share no table or port: each test names its own. A failed environment's
# output is printed in full; the summary adds up every environment's JUnit report.
TOX_PARALLEL ?= 2

# The broker the suite runs on: Apache Kafka from .ci/kafka (jars from Maven Central), unless
# PYHARVEST_TEST_KAFKA names another cluster (or `embedded`). The secured one (tox -e secure)
# is `make kafka-secure`'s, unless PYHARVEST_TEST_SECURE_KAFKA names another's directory.
KAFKA_PORT ?= 19092
export KAFKA_PORT

kafka: $(STAMP)
	bash .ci/kafka/kafka start

kafka-stop:
	bash .ci/kafka/kafka stop

kafka-clean:
	bash .ci/kafka/kafka clean

# The replicated cluster the cluster fault tests run on (.ci/kafka/cluster; same jars as `make kafka`).
KAFKA_CLUSTER_PORTS ?= 19192 19194 19196
export KAFKA_CLUSTER_PORTS

kafka-cluster: $(STAMP)
	bash .ci/kafka/cluster start

kafka-cluster-stop:
	bash .ci/kafka/cluster stop

kafka-cluster-clean:
	bash .ci/kafka/cluster clean

# The least-privilege tests' broker (tox -e secure): .ci/kafka/secure, beside the plain one.
KAFKA_SECURE_PORT ?= 19392
export KAFKA_SECURE_PORT

kafka-secure: $(STAMP)
	bash .ci/kafka/secure start

kafka-secure-stop:
	bash .ci/kafka/secure stop

kafka-secure-clean:
	bash .ci/kafka/secure clean

# The typed-message tests' registry (.ci/schema-registry), unless PYHARVEST_TEST_SCHEMA_REGISTRY
# names another's Confluent-compatible URL.
SCHEMA_REGISTRY_PORT ?= 18081
export SCHEMA_REGISTRY_PORT

schema-registry:
	bash .ci/schema-registry start

schema-registry-stop:
	bash .ci/schema-registry stop

# Then the environments that run alone (.ci/envs alone: the fault tests on the three-node cluster,
# which `make test` starts once, unless PYHARVEST_TEST_KAFKA_CLUSTER names one already).
test: $(STAMP)
	bash .ci/services
	bash .ci/tools
	@if [ -z "$$PYHARVEST_TEST_KAFKA" ]; then bash .ci/kafka/kafka start; fi
	@if [ -z "$$PYHARVEST_TEST_SECURE_KAFKA" ]; then bash .ci/kafka/secure start; fi
	@if [ -z "$$PYHARVEST_TEST_SCHEMA_REGISTRY" ]; then bash .ci/schema-registry start; fi
	rm -rf .tox/junit
	status=0; export PYHARVEST_TEST_KAFKA="$${PYHARVEST_TEST_KAFKA:-127.0.0.1:$(KAFKA_PORT)}"; \
	export PYHARVEST_TEST_SCHEMA_REGISTRY="$${PYHARVEST_TEST_SCHEMA_REGISTRY:-$$(bash .ci/schema-registry url)}"; \
	export PYHARVEST_TEST_SECURE_KAFKA="$${PYHARVEST_TEST_SECURE_KAFKA:-$(CURDIR)/.kafka/secure}"; \
	$(VENV)/bin/tox run-parallel -p $(TOX_PARALLEL) --parallel-no-spinner -e "$$(bash .ci/envs)" -- $(ARGS) || status=$$?; \
	if [ -z "$$PYHARVEST_TEST_KAFKA_CLUSTER" ]; then \
	  bash .ci/kafka/cluster start && export PYHARVEST_TEST_KAFKA_CLUSTER="$$(bash .ci/kafka/cluster bootstrap)"; \
	fi; \
	$(VENV)/bin/tox run -e "$$(bash .ci/envs alone)" -- $(ARGS) || status=$$((status ? status : 1)); \
	$(VENV)/bin/python .ci/summarize.py .tox/junit || status=$$((status ? status : 1)); exit $$status

clean:
	rm -rf $(VENV) .tox build dist *.egg-info
