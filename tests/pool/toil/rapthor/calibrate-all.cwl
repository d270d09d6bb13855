cwlVersion: v1.2
class: Workflow
doc: |
  The calibrate scatter of workflow.cwl alone (one step: one round of matching), for tests of
  how one step's jobs are placed.
requirements:
  ScatterFeatureRequirement: {}
  ResourceRequirement:
    coresMin: 1
    ramMin: 100
    tmpdirMin: 10
    outdirMin: 10
inputs:
  directions: string[]
outputs:
  calibrated:
    type: File[]
    outputSource: calibrate/record
steps:
  calibrate:
    run: calibrate.cwl
    scatter: label
    in:
      label: directions
    out: [record]
