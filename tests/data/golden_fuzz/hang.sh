#!/bin/sh
# A program under test that never finishes (until it is stopped). Its
# process id and that of the child it waits for go to OUTPUTS/pids, so that
# a test can check that both were stopped.
sleep 600 &
echo "$$ $!" > "$2/pids"
wait
