cwlVersion: v1.2
class: Workflow
doc: |
  Rapthor's shape without its software: calibrate each direction (a scatter; each job reads
  the observation), then image them together (reads the sky model). Every job writes where it
  ran (calibrate.cwl, image.cwl).
requirements:
  ScatterFeatureRequirement: {}
  ResourceRequirement: # small: the test pool's slots have 512 MB (CWL's defaults ask 1 GiB disk)
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
  imaged:
    type: File
    outputSource: image/record
steps:
  calibrate:
    run: calibrate.cwl
    scatter: label
    in:
      label: directions
    out: [record]
  image:
    run: image.cwl
    in:
      label:
        default: image
      after: calibrate/record
    out: [record]
