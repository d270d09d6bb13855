cwlVersion: v1.2
class: CommandLineTool
doc: |
  Calibrates one direction (reads the observation). Writes "<label> <site> <cluster>": the
  slot's GLIDEIN_Site from the machine ad and the job's ClusterId from the job ad (files the
  starter names in variables that reach the tool with --preserve-entire-environment).
inputs:
  label: string
outputs:
  record: stdout
stdout: $(inputs.label).txt
baseCommand: [sh, -c]
arguments:
  - |
    site=`sed -n 's/^GLIDEIN_Site = "\(.*\)"$/\1/p' "$_CONDOR_MACHINE_AD"`
    cluster=`sed -n 's/^ClusterId = //p' "$_CONDOR_JOB_AD"`
    echo "$1 $site $cluster"
    sleep 6  # a calibration takes a while: the scatter's jobs overlap, so rank-only must spill
  - where
  - $(inputs.label)
