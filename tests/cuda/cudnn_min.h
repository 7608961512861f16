// The declarations of cuDNN 9 that tests/cuda/cudnn_conv.cu uses, for machines without cuDNN's
// headers (CI): the types and prototypes of cudnn_graph.h, written from NVIDIA's documentation.
// Where the real headers are present (`python3 -c 'import nvidia.cudnn'`), the program uses
// them instead.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cuda_runtime.h>

extern "C" {
typedef int cudnnStatus_t;
typedef struct cudnnContext *cudnnHandle_t;
typedef void *cudnnBackendDescriptor_t;
typedef int cudnnBackendDescriptorType_t;
typedef int cudnnBackendAttributeName_t;
typedef int cudnnBackendAttributeType_t;
typedef struct cudnnTensorStruct *cudnnTensorDescriptor_t;

#define CUDNN_STATUS_SUCCESS 0
#define CUDNN_TYPE_HANDLE 0
#define CUDNN_TYPE_DATA_TYPE 1
#define CUDNN_TYPE_INT64 3
#define CUDNN_TYPE_FLOAT 4
#define CUDNN_TYPE_VOID_PTR 6
#define CUDNN_TYPE_CONVOLUTION_MODE 7
#define CUDNN_TYPE_HEUR_MODE 8
#define CUDNN_TYPE_BACKEND_DESCRIPTOR 15

cudnnStatus_t cudnnCreate(cudnnHandle_t *handle);
cudnnStatus_t cudnnDestroy(cudnnHandle_t handle);
cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t streamId);
size_t cudnnGetVersion(void);
const char *cudnnGetErrorString(cudnnStatus_t status);
void cudnnGetLastErrorString(char *message, size_t max_size);
cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t descriptorType,
                                           cudnnBackendDescriptor_t *descriptor);
cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t descriptor);
cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t descriptor);
cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t descriptor,
                                       cudnnBackendAttributeName_t attributeName,
                                       cudnnBackendAttributeType_t attributeType, int64_t elementCount,
                                       const void *arrayOfElements);
cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t const descriptor,
                                       cudnnBackendAttributeName_t attributeName,
                                       cudnnBackendAttributeType_t attributeType, int64_t requestedElementCount,
                                       int64_t *elementCount, void *arrayOfElements);
cudnnStatus_t cudnnBackendExecute(cudnnHandle_t handle, cudnnBackendDescriptor_t executionPlan,
                                  cudnnBackendDescriptor_t variantPack);
cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t *tensorDesc);
}
