# Sourced by the scripts that start a JVM in the background (.ci/kafka/kafka, cluster, secure,
# .ci/schema-registry): how a start tells that the process it forked has ended.
#
# A child forked a moment ago may not have exec'd its JVM yet: ps still shows the shell's
# command line, so matching it against the JVM's (as `alive` does for a pid file's process)
# reads a start in progress as a JVM that exited, with an empty log (issue 53's "the JVM
# exited during start": seen in 2 of 200 forks on a quiet machine). A start waits by the
# process's state instead: gone, or a zombie not yet reaped, is exited.
exited() {
  local state
  state=$(ps -o stat= -p "$1" 2>/dev/null) || return 0
  [[ $state == Z* ]]
}
