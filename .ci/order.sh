# Sourced by readme.sh and package.sh. order_then_duplicate LINE BODY runs the curl line a
# gateway printed at start until its database is open (503, or no answer, until then; up
# to ~20 s), and expects it to place an order (200), then to meet the mutex (409
# DUPLICATE). Prints each answer; returns 1 at the first wrong one, saying which.
order_then_duplicate() {
    local line=$1 body=$2 answer code
    for answer in 200 409; do
        code=000
        for _ in $(seq 1 100); do
            # The line is a gateway's own, aimed at 127.0.0.1; the bound on its time is ours.
            code=$(bash -c "$line --silent --max-time 20 -o '$body' -w '%{http_code}'") || code=000
            [[ $code == 503 || $code == 000 ]] || break
            sleep 0.2
        done
        if [[ $code != "$answer" ]]; then
            echo "the curl line answered $code, not $answer: $(cat "$body" 2> /dev/null)"
            return 1
        fi
        echo "the curl line answered $code: $(head -c 300 "$body")"
    done
}
