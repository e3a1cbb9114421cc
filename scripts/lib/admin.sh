# Helpers of the benchmark scripts that start a coordinator themselves and call its admin API.
# admin_get needs BIN (the ebbflow-runtime binary) and EBBFLOW_JOB_SECRET; both follow
# EBBFLOW_TRANSPORT_SECURITY (tls, the default, or none) as the processes do.

# admin_url ADDR: the coordinator's URL for the job's transport security.
admin_url() {
  if [[ ${EBBFLOW_TRANSPORT_SECURITY:-tls} == none ]]; then echo "http://$1"; else echo "https://$1"; fi
}

# admin_get URL: GET URL with the job's token; over TLS, accepting only the job's key (curl pins
# the public key the job secret derives: the certificate names no host, hence -k).
admin_get() {
  local tls=()
  if [[ $1 == https://* ]]; then
    if [[ ${ADMIN_PIN_SECRET:-} != "$EBBFLOW_JOB_SECRET" ]]; then
      ADMIN_PIN=$("$BIN" admin-certificate --pin)
      ADMIN_PIN_SECRET=$EBBFLOW_JOB_SECRET
    fi
    tls=(-k --pinnedpubkey "$ADMIN_PIN")
  fi
  curl -fs "${tls[@]}" -H "Authorization: Bearer $EBBFLOW_JOB_SECRET" "$1"
}
