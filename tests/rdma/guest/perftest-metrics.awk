# Prints "METRIC <name> <value> <unit>" from a test's log (run with -v name=TEST).
#  - lines the test itself printed as "METRIC ..." or "NOTE ..." are passed through;
#  - perftest BW tables: "BW average" column, unit as perftest labels it: MB/sec
#    (perftest's MB is 2^20 bytes) or Gb/sec (10^9 bits, with --report_gbits);
#  - perftest latency tables: t_typical (median) in usec, or t_avg when t_typical is not
#    a finite number (TCG sometimes yields "inf"); nothing when neither is finite.
function finite(v) { return v ~ /^-?[0-9]+(\.[0-9]+)?$/ }
/^(METRIC|NOTE) / { print; next }
/BW average\[/ {
  unit = $0; sub(/.*BW average\[/, "", unit); sub(/\].*/, "", unit)
  # columns: #bytes #iterations BW-peak BW-average MsgRate (a QoS table adds #sl)
  col = ($0 ~ /#sl/) ? 5 : 4
  kind = "bw"; next
}
/t_typical\[usec\]/ { kind = "lat"; next }
/t_avg\[usec\]/ && kind == "" { kind = "latdur"; next }   # latency with -D: t_avg only
kind != "" && $1 ~ /^[0-9]+$/ {
  if (kind == "bw" && NF >= col && finite($col)) {
    printf "METRIC %s %s %s\n", name, $col, unit; found = 1
  } else if (kind == "lat" && NF >= 6) {
    if (finite($5)) { printf "METRIC %s %s usec\n", name, $5; found = 1 }
    else if (finite($6)) { printf "METRIC %s %s usec\n", name, $6; found = 1 }
    else printf "NOTE %s: perftest printed no finite latency (t_typical=%s t_avg=%s)\n", name, $5, $6
  } else if (kind == "latdur" && NF >= 3 && finite($3)) {
    printf "METRIC %s %s usec\n", name, $3; found = 1
  }
  kind = ""
}
