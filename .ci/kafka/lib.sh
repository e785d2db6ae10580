# What .ci/kafka/kafka (one node) and .ci/kafka/cluster (three) share: the jars' classpath, the
# JVM's command line and a few shell helpers. Sourced, not run; the caller sets `here` (this
# directory), `root` (the repository) and `say`/`die`.

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
# A killed JVM may linger as a zombie until its parent reaps it: alive means running Kafka.
alive() { ps -o args= -p "$1" 2>/dev/null | grep -q "kafka.Kafka"; }

classpath() {
  # Resolved once per pom (its hash names the file); Maven keeps the jars in ~/.m2.
  local sum cp
  sum=$(sha1sum "$here/pom.xml" | cut -c1-12)
  cp=$root/.kafka/classpath-$sum.txt
  if [ ! -s "$cp" ]; then
    command -v mvn >/dev/null 2>&1 || die "Maven (mvn) is not installed: it fetches Apache Kafka's jars from Maven Central"
    mkdir -p "$root/.kafka"
    say "fetching Apache Kafka's jars with Maven (once; cached in ~/.m2)" >&2
    if ! mvn -q -B -f "$here/pom.xml" dependency:build-classpath -Dmdep.outputFile="$cp.tmp" >"$root/.kafka/mvn.log" 2>&1; then
      tail -n 30 "$root/.kafka/mvn.log" >&2
      die "Maven could not fetch Apache Kafka's jars (log: $root/.kafka/mvn.log)"
    fi
    mv "$cp.tmp" "$cp"
  fi
  cat "$cp"
}

check_java() {
  command -v java >/dev/null 2>&1 || die "Java is not installed: Apache Kafka 4.x needs Java 17 or newer"
  local major
  major=$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n1)
  [ -n "$major" ] && [ "$major" -ge 17 ] || die "Apache Kafka 4.x needs Java 17 or newer (java -version says ${major:-nothing})"
}

# kafka_jvm LOGS_DIR HEAP: the java command line (up to the main class) into the array `jvm`.
kafka_jvm() {
  local cp
  cp=$(classpath)
  jvm=(java -Xms256m "-Xmx$2" -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -Djava.awt.headless=true
       "-Dkafka.logs.dir=$1" "-Dlog4j2.configurationFile=$here/log4j2.properties" -cp "$cp")
}
