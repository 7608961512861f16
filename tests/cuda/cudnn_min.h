// The declarations of cuDNN 9 that tests/cuda/cudnn_conv.cu, cudnn_batchnorm.cu,
// cudnn_mnist_layers.cu and cudnn_mnist_full.cu use, for machines without cuDNN's headers (CI): the types and
// prototypes of cudnn_graph.h, cudnn_ops.h and cudnn_cnn.h, written from NVIDIA's
// documentation.
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
typedef struct cudnnFilterStruct *cudnnFilterDescriptor_t;
typedef struct cudnnActivationStruct *cudnnActivationDescriptor_t;
typedef enum { CUDNN_DATA_FLOAT_ = 0 } cudnnDataType_t;
typedef enum { CUDNN_TENSOR_NCHW_ = 0 } cudnnTensorFormat_t;
typedef enum { CUDNN_BATCHNORM_PER_ACTIVATION_ = 0 } cudnnBatchNormMode_t;
typedef enum { CUDNN_BATCHNORM_OPS_BN_ = 0 } cudnnBatchNormOps_t;
typedef struct cudnnConvolutionStruct *cudnnConvolutionDescriptor_t;
typedef struct cudnnPoolingStruct *cudnnPoolingDescriptor_t;
typedef struct cudnnLRNStruct *cudnnLRNDescriptor_t;
typedef struct cudnnOpTensorStruct *cudnnOpTensorDescriptor_t;
typedef enum { CUDNN_POOLING_MAX_ = 0 } cudnnPoolingMode_t;
typedef enum { CUDNN_SOFTMAX_FAST_ = 0 } cudnnSoftmaxAlgorithm_t;
typedef enum { CUDNN_SOFTMAX_MODE_INSTANCE_ = 0 } cudnnSoftmaxMode_t;
typedef enum { CUDNN_LRN_CROSS_CHANNEL_DIM1_ = 0 } cudnnLRNMode_t;
typedef enum { CUDNN_OP_TENSOR_ADD_ = 0 } cudnnOpTensorOp_t;
typedef struct cudnnReduceTensorStruct *cudnnReduceTensorDescriptor_t;
typedef enum { CUDNN_REDUCE_TENSOR_ADD_ = 0 } cudnnReduceTensorOp_t;
typedef enum { CUDNN_REDUCE_TENSOR_NO_INDICES_ = 0 } cudnnReduceTensorIndices_t;
typedef enum { CUDNN_32BIT_INDICES_ = 0 } cudnnIndicesType_t;
typedef struct cudnnRNNStruct *cudnnRNNDescriptor_t;
typedef enum { CUDNN_CONVOLUTION_ = 0 } cudnnConvolutionMode_t;
typedef enum { CUDNN_DEFAULT_MATH_ = 0 } cudnnMathType_t;
typedef enum { CUDNN_ACTIVATION_SIGMOID_ = 0 } cudnnActivationMode_t;
typedef enum { CUDNN_NOT_PROPAGATE_NAN_ = 0 } cudnnNanPropagation_t;
typedef enum { CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM_ = 0 } cudnnConvolutionFwdAlgo_t;
typedef enum { CUDNN_CONVOLUTION_BWD_DATA_ALGO_0_ = 0 } cudnnConvolutionBwdDataAlgo_t;
typedef enum { CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0_ = 0 } cudnnConvolutionBwdFilterAlgo_t;
typedef enum { CUDNN_NON_DETERMINISTIC_ = 0 } cudnnDeterminism_t;
typedef struct {
    cudnnConvolutionFwdAlgo_t algo;
    cudnnStatus_t status;
    float time;
    size_t memory;
    cudnnDeterminism_t determinism;
    cudnnMathType_t mathType;
    int reserved[3];
} cudnnConvolutionFwdAlgoPerf_t;
typedef struct {
    cudnnConvolutionBwdDataAlgo_t algo;
    cudnnStatus_t status;
    float time;
    size_t memory;
    cudnnDeterminism_t determinism;
    cudnnMathType_t mathType;
    int reserved[3];
} cudnnConvolutionBwdDataAlgoPerf_t;
typedef struct {
    cudnnConvolutionBwdFilterAlgo_t algo;
    cudnnStatus_t status;
    float time;
    size_t memory;
    cudnnDeterminism_t determinism;
    cudnnMathType_t mathType;
    int reserved[3];
} cudnnConvolutionBwdFilterAlgoPerf_t;

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
cudnnStatus_t cudnnGetStream(cudnnHandle_t handle, cudaStream_t *streamId);
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
cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t tensorDesc);
cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t tensorDesc, cudnnTensorFormat_t format,
                                         cudnnDataType_t dataType, int n, int c, int h, int w);
cudnnStatus_t cudnnSetTensor4dDescriptorEx(cudnnTensorDescriptor_t tensorDesc, cudnnDataType_t dataType, int n, int c,
                                           int h, int w, int nStride, int cStride, int hStride, int wStride);
cudnnStatus_t cudnnSetTensorNdDescriptor(cudnnTensorDescriptor_t tensorDesc, cudnnDataType_t dataType, int nbDims,
                                         const int dimA[], const int strideA[]);
cudnnStatus_t cudnnSetTensorNdDescriptorEx(cudnnTensorDescriptor_t tensorDesc, cudnnTensorFormat_t format,
                                           cudnnDataType_t dataType, int nbDims, const int dimA[]);
cudnnStatus_t cudnnGetTensor4dDescriptor(const cudnnTensorDescriptor_t tensorDesc, cudnnDataType_t *dataType, int *n,
                                         int *c, int *h, int *w, int *nStride, int *cStride, int *hStride,
                                         int *wStride);
cudnnStatus_t cudnnGetTensorNdDescriptor(const cudnnTensorDescriptor_t tensorDesc, int nbDimsRequested,
                                         cudnnDataType_t *dataType, int *nbDims, int dimA[], int strideA[]);
cudnnStatus_t cudnnGetTensorSizeInBytes(const cudnnTensorDescriptor_t tensorDesc, size_t *size);
cudnnStatus_t cudnnDeriveBNTensorDescriptor(cudnnTensorDescriptor_t derivedBnDesc, const cudnnTensorDescriptor_t xDesc,
                                            cudnnBatchNormMode_t mode);
cudnnStatus_t cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, cudnnBatchNormOps_t bnOps, const cudnnTensorDescriptor_t xDesc,
    const cudnnTensorDescriptor_t zDesc, const cudnnTensorDescriptor_t yDesc,
    const cudnnTensorDescriptor_t bnScaleBiasMeanVarDesc, const cudnnActivationDescriptor_t activationDesc,
    size_t *sizeInBytes);
cudnnStatus_t cudnnGetBatchNormalizationBackwardExWorkspaceSize(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, cudnnBatchNormOps_t bnOps, const cudnnTensorDescriptor_t xDesc,
    const cudnnTensorDescriptor_t yDesc, const cudnnTensorDescriptor_t dyDesc, const cudnnTensorDescriptor_t dzDesc,
    const cudnnTensorDescriptor_t dxDesc, const cudnnTensorDescriptor_t dBnScaleBiasDesc,
    const cudnnActivationDescriptor_t activationDesc, size_t *sizeInBytes);
cudnnStatus_t cudnnGetBatchNormalizationTrainingExReserveSpaceSize(cudnnHandle_t handle, cudnnBatchNormMode_t mode,
                                                                   cudnnBatchNormOps_t bnOps,
                                                                   const cudnnActivationDescriptor_t activationDesc,
                                                                   const cudnnTensorDescriptor_t xDesc,
                                                                   size_t *sizeInBytes);
cudnnStatus_t cudnnBatchNormalizationForwardTraining(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, const void *alpha, const void *beta,
    const cudnnTensorDescriptor_t xDesc, const void *x, const cudnnTensorDescriptor_t yDesc, void *y,
    const cudnnTensorDescriptor_t bnScaleBiasMeanVarDesc, const void *bnScale, const void *bnBias,
    double exponentialAverageFactor, void *resultRunningMean, void *resultRunningVariance, double epsilon,
    void *resultSaveMean, void *resultSaveInvVariance);
cudnnStatus_t cudnnBatchNormalizationForwardTrainingEx(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, cudnnBatchNormOps_t bnOps, const void *alpha, const void *beta,
    const cudnnTensorDescriptor_t xDesc, const void *xData, const cudnnTensorDescriptor_t zDesc, const void *zData,
    const cudnnTensorDescriptor_t yDesc, void *yData, const cudnnTensorDescriptor_t bnScaleBiasMeanVarDesc,
    const void *bnScale, const void *bnBias, double exponentialAverageFactor, void *resultRunningMean,
    void *resultRunningVariance, double epsilon, void *resultSaveMean, void *resultSaveInvVariance,
    cudnnActivationDescriptor_t activationDesc, void *workspace, size_t workSpaceSizeInBytes, void *reserveSpace,
    size_t reserveSpaceSizeInBytes);
cudnnStatus_t cudnnBatchNormalizationForwardInference(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, const void *alpha, const void *beta,
    const cudnnTensorDescriptor_t xDesc, const void *x, const cudnnTensorDescriptor_t yDesc, void *y,
    const cudnnTensorDescriptor_t bnScaleBiasMeanVarDesc, const void *bnScale, const void *bnBias,
    const void *estimatedMean, const void *estimatedVariance, double epsilon);
cudnnStatus_t cudnnBatchNormalizationBackward(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, const void *alphaDataDiff, const void *betaDataDiff,
    const void *alphaParamDiff, const void *betaParamDiff, const cudnnTensorDescriptor_t xDesc, const void *x,
    const cudnnTensorDescriptor_t dyDesc, const void *dy, const cudnnTensorDescriptor_t dxDesc, void *dx,
    const cudnnTensorDescriptor_t dBnScaleBiasDesc, const void *bnScale, void *dBnScaleResult, void *dBnBiasResult,
    double epsilon, const void *savedMean, const void *savedInvVariance);
cudnnStatus_t cudnnBatchNormalizationBackwardEx(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, cudnnBatchNormOps_t bnOps, const void *alphaDataDiff,
    const void *betaDataDiff, const void *alphaParamDiff, const void *betaParamDiff,
    const cudnnTensorDescriptor_t xDesc, const void *xData, const cudnnTensorDescriptor_t yDesc, const void *yData,
    const cudnnTensorDescriptor_t dyDesc, const void *dyData, const cudnnTensorDescriptor_t dzDesc, void *dzData,
    const cudnnTensorDescriptor_t dxDesc, void *dxData, const cudnnTensorDescriptor_t dBnScaleBiasDesc,
    const void *bnScaleData, const void *bnBiasData, void *dBnScaleData, void *dBnBiasData, double epsilon,
    const void *savedMean, const void *savedInvVariance, cudnnActivationDescriptor_t activationDesc, void *workSpace,
    size_t workSpaceSizeInBytes, void *reserveSpace, size_t reserveSpaceSizeInBytes);
cudnnStatus_t cudnnCreateRNNDescriptor(cudnnRNNDescriptor_t *rnnDesc);
cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t *filterDesc);
cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t filterDesc);
cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t filterDesc, cudnnDataType_t dataType,
                                         cudnnTensorFormat_t format, int k, int c, int h, int w);
cudnnStatus_t cudnnSetFilterNdDescriptor(cudnnFilterDescriptor_t filterDesc, cudnnDataType_t dataType,
                                         cudnnTensorFormat_t format, int nbDims, const int filterDimA[]);
cudnnStatus_t cudnnGetFilter4dDescriptor(const cudnnFilterDescriptor_t filterDesc, cudnnDataType_t *dataType,
                                         cudnnTensorFormat_t *format, int *k, int *c, int *h, int *w);
cudnnStatus_t cudnnGetFilterNdDescriptor(const cudnnFilterDescriptor_t filterDesc, int nbDimsRequested,
                                         cudnnDataType_t *dataType, cudnnTensorFormat_t *format, int *nbDims,
                                         int filterDimA[]);
cudnnStatus_t cudnnGetFilterSizeInBytes(const cudnnFilterDescriptor_t filterDesc, size_t *size);
cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t *convDesc);
cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t convDesc);
cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t convDesc, int pad_h, int pad_w, int u,
                                              int v, int dilation_h, int dilation_w, cudnnConvolutionMode_t mode,
                                              cudnnDataType_t computeType);
cudnnStatus_t cudnnSetConvolutionNdDescriptor(cudnnConvolutionDescriptor_t convDesc, int arrayLength,
                                              const int padA[], const int filterStrideA[], const int dilationA[],
                                              cudnnConvolutionMode_t mode, cudnnDataType_t computeType);
cudnnStatus_t cudnnGetConvolution2dDescriptor(const cudnnConvolutionDescriptor_t convDesc, int *pad_h, int *pad_w,
                                              int *u, int *v, int *dilation_h, int *dilation_w,
                                              cudnnConvolutionMode_t *mode, cudnnDataType_t *computeType);
cudnnStatus_t cudnnGetConvolutionNdDescriptor(const cudnnConvolutionDescriptor_t convDesc, int arrayLengthRequested,
                                              int *arrayLength, int padA[], int strideA[], int dilationA[],
                                              cudnnConvolutionMode_t *mode, cudnnDataType_t *computeType);
cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t convDesc, cudnnMathType_t mathType);
cudnnStatus_t cudnnGetConvolutionMathType(cudnnConvolutionDescriptor_t convDesc, cudnnMathType_t *mathType);
cudnnStatus_t cudnnSetConvolutionGroupCount(cudnnConvolutionDescriptor_t convDesc, int groupCount);
cudnnStatus_t cudnnGetConvolutionGroupCount(cudnnConvolutionDescriptor_t convDesc, int *groupCount);
cudnnStatus_t cudnnGetConvolution2dForwardOutputDim(const cudnnConvolutionDescriptor_t convDesc,
                                                    const cudnnTensorDescriptor_t inputTensorDesc,
                                                    const cudnnFilterDescriptor_t filterDesc, int *n, int *c, int *h,
                                                    int *w);
cudnnStatus_t cudnnGetConvolutionNdForwardOutputDim(const cudnnConvolutionDescriptor_t convDesc,
                                                    const cudnnTensorDescriptor_t inputTensorDesc,
                                                    const cudnnFilterDescriptor_t filterDesc, int nbDims,
                                                    int tensorOuputDimA[]);
cudnnStatus_t cudnnGetConvolutionForwardAlgorithmMaxCount(cudnnHandle_t handle, int *count);
cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithmMaxCount(cudnnHandle_t handle, int *count);
cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(cudnnHandle_t handle, int *count);
cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(cudnnHandle_t handle, const cudnnTensorDescriptor_t srcDesc,
                                                     const cudnnFilterDescriptor_t filterDesc,
                                                     const cudnnConvolutionDescriptor_t convDesc,
                                                     const cudnnTensorDescriptor_t destDesc,
                                                     const int requestedAlgoCount, int *returnedAlgoCount,
                                                     cudnnConvolutionFwdAlgoPerf_t *perfResults);
cudnnStatus_t cudnnFindConvolutionForwardAlgorithm(cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc,
                                                   const cudnnFilterDescriptor_t wDesc,
                                                   const cudnnConvolutionDescriptor_t convDesc,
                                                   const cudnnTensorDescriptor_t yDesc, const int requestedAlgoCount,
                                                   int *returnedAlgoCount, cudnnConvolutionFwdAlgoPerf_t *perfResults);
cudnnStatus_t cudnnFindConvolutionForwardAlgorithmEx(cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc,
                                                     const void *x, const cudnnFilterDescriptor_t wDesc, const void *w,
                                                     const cudnnConvolutionDescriptor_t convDesc,
                                                     const cudnnTensorDescriptor_t yDesc, void *y,
                                                     const int requestedAlgoCount, int *returnedAlgoCount,
                                                     cudnnConvolutionFwdAlgoPerf_t *perfResults, void *workSpace,
                                                     size_t workSpaceSizeInBytes);
cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(cudnnHandle_t handle, const cudnnFilterDescriptor_t filterDesc,
                                                          const cudnnTensorDescriptor_t diffDesc,
                                                          const cudnnConvolutionDescriptor_t convDesc,
                                                          const cudnnTensorDescriptor_t gradDesc,
                                                          const int requestedAlgoCount, int *returnedAlgoCount,
                                                          cudnnConvolutionBwdDataAlgoPerf_t *perfResults);
cudnnStatus_t cudnnFindConvolutionBackwardDataAlgorithmEx(cudnnHandle_t handle, const cudnnFilterDescriptor_t wDesc,
                                                          const void *w, const cudnnTensorDescriptor_t dyDesc,
                                                          const void *dy, const cudnnConvolutionDescriptor_t convDesc,
                                                          const cudnnTensorDescriptor_t dxDesc, void *dx,
                                                          const int requestedAlgoCount, int *returnedAlgoCount,
                                                          cudnnConvolutionBwdDataAlgoPerf_t *perfResults,
                                                          void *workSpace, size_t workSpaceSizeInBytes);
cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(cudnnHandle_t handle, const cudnnTensorDescriptor_t srcDesc,
                                                            const cudnnTensorDescriptor_t diffDesc,
                                                            const cudnnConvolutionDescriptor_t convDesc,
                                                            const cudnnFilterDescriptor_t gradDesc,
                                                            const int requestedAlgoCount, int *returnedAlgoCount,
                                                            cudnnConvolutionBwdFilterAlgoPerf_t *perfResults);
cudnnStatus_t cudnnFindConvolutionBackwardFilterAlgorithm(cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc,
                                                          const cudnnTensorDescriptor_t dyDesc,
                                                          const cudnnConvolutionDescriptor_t convDesc,
                                                          const cudnnFilterDescriptor_t dwDesc,
                                                          const int requestedAlgoCount, int *returnedAlgoCount,
                                                          cudnnConvolutionBwdFilterAlgoPerf_t *perfResults);
cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc,
                                                      const cudnnFilterDescriptor_t wDesc,
                                                      const cudnnConvolutionDescriptor_t convDesc,
                                                      const cudnnTensorDescriptor_t yDesc,
                                                      cudnnConvolutionFwdAlgo_t algo, size_t *sizeInBytes);
cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(cudnnHandle_t handle, const cudnnFilterDescriptor_t wDesc,
                                                           const cudnnTensorDescriptor_t dyDesc,
                                                           const cudnnConvolutionDescriptor_t convDesc,
                                                           const cudnnTensorDescriptor_t dxDesc,
                                                           cudnnConvolutionBwdDataAlgo_t algo, size_t *sizeInBytes);
cudnnStatus_t cudnnGetConvolutionBackwardFilterWorkspaceSize(cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc,
                                                             const cudnnTensorDescriptor_t dyDesc,
                                                             const cudnnConvolutionDescriptor_t convDesc,
                                                             const cudnnFilterDescriptor_t gradDesc,
                                                             cudnnConvolutionBwdFilterAlgo_t algo, size_t *sizeInBytes);
cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t handle, const void *alpha, const cudnnTensorDescriptor_t xDesc,
                                      const void *x, const cudnnFilterDescriptor_t wDesc, const void *w,
                                      const cudnnConvolutionDescriptor_t convDesc, cudnnConvolutionFwdAlgo_t algo,
                                      void *workSpace, size_t workSpaceSizeInBytes, const void *beta,
                                      const cudnnTensorDescriptor_t yDesc, void *y);
cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t handle, const void *alpha, const cudnnFilterDescriptor_t wDesc,
                                           const void *w, const cudnnTensorDescriptor_t dyDesc, const void *dy,
                                           const cudnnConvolutionDescriptor_t convDesc,
                                           cudnnConvolutionBwdDataAlgo_t algo, void *workSpace,
                                           size_t workSpaceSizeInBytes, const void *beta,
                                           const cudnnTensorDescriptor_t dxDesc, void *dx);
cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t handle, const void *alpha, const cudnnTensorDescriptor_t xDesc,
                                             const void *x, const cudnnTensorDescriptor_t dyDesc, const void *dy,
                                             const cudnnConvolutionDescriptor_t convDesc,
                                             cudnnConvolutionBwdFilterAlgo_t algo, void *workSpace,
                                             size_t workSpaceSizeInBytes, const void *beta,
                                             const cudnnFilterDescriptor_t dwDesc, void *dw);
cudnnStatus_t cudnnConvolutionBackwardBias(cudnnHandle_t handle, const void *alpha, const cudnnTensorDescriptor_t dyDesc,
                                           const void *dy, const void *beta, const cudnnTensorDescriptor_t dbDesc,
                                           void *db);
cudnnStatus_t cudnnConvolutionBiasActivationForward(
    cudnnHandle_t handle, const void *alpha1, const cudnnTensorDescriptor_t xDesc, const void *x,
    const cudnnFilterDescriptor_t wDesc, const void *w, const cudnnConvolutionDescriptor_t convDesc,
    cudnnConvolutionFwdAlgo_t algo, void *workSpace, size_t workSpaceSizeInBytes, const void *alpha2,
    const cudnnTensorDescriptor_t zDesc, const void *z, const cudnnTensorDescriptor_t biasDesc, const void *bias,
    const cudnnActivationDescriptor_t activationDesc, const cudnnTensorDescriptor_t yDesc, void *y);
cudnnStatus_t cudnnCreateActivationDescriptor(cudnnActivationDescriptor_t *activationDesc);
cudnnStatus_t cudnnDestroyActivationDescriptor(cudnnActivationDescriptor_t activationDesc);
cudnnStatus_t cudnnSetActivationDescriptor(cudnnActivationDescriptor_t activationDesc, cudnnActivationMode_t mode,
                                           cudnnNanPropagation_t reluNanOpt, double coef);
cudnnStatus_t cudnnGetActivationDescriptor(const cudnnActivationDescriptor_t activationDesc,
                                           cudnnActivationMode_t *mode, cudnnNanPropagation_t *reluNanOpt,
                                           double *coef);
cudnnStatus_t cudnnActivationForward(cudnnHandle_t handle, cudnnActivationDescriptor_t activationDesc,
                                     const void *alpha, const cudnnTensorDescriptor_t xDesc, const void *x,
                                     const void *beta, const cudnnTensorDescriptor_t yDesc, void *y);
cudnnStatus_t cudnnActivationBackward(cudnnHandle_t handle, cudnnActivationDescriptor_t activationDesc,
                                      const void *alpha, const cudnnTensorDescriptor_t yDesc, const void *y,
                                      const cudnnTensorDescriptor_t dyDesc, const void *dy,
                                      const cudnnTensorDescriptor_t xDesc, const void *x, const void *beta,
                                      const cudnnTensorDescriptor_t dxDesc, void *dx);
cudnnStatus_t cudnnAddTensor(cudnnHandle_t handle, const void *alpha, const cudnnTensorDescriptor_t aDesc, const void *A,
                             const void *beta, const cudnnTensorDescriptor_t cDesc, void *C);
cudnnStatus_t cudnnSetTensor(cudnnHandle_t handle, const cudnnTensorDescriptor_t yDesc, void *y, const void *valuePtr);
cudnnStatus_t cudnnScaleTensor(cudnnHandle_t handle, const cudnnTensorDescriptor_t yDesc, void *y, const void *alpha);
cudnnStatus_t cudnnTransformTensor(cudnnHandle_t handle, const void *alpha, const cudnnTensorDescriptor_t xDesc,
                                   const void *x, const void *beta, const cudnnTensorDescriptor_t yDesc, void *y);
cudnnStatus_t cudnnCreateOpTensorDescriptor(cudnnOpTensorDescriptor_t *opTensorDesc);
cudnnStatus_t cudnnDestroyOpTensorDescriptor(cudnnOpTensorDescriptor_t opTensorDesc);
cudnnStatus_t cudnnSetOpTensorDescriptor(cudnnOpTensorDescriptor_t opTensorDesc, cudnnOpTensorOp_t opTensorOp,
                                         cudnnDataType_t opTensorCompType, cudnnNanPropagation_t opTensorNanOpt);
cudnnStatus_t cudnnGetOpTensorDescriptor(const cudnnOpTensorDescriptor_t opTensorDesc, cudnnOpTensorOp_t *opTensorOp,
                                         cudnnDataType_t *opTensorCompType, cudnnNanPropagation_t *opTensorNanOpt);
cudnnStatus_t cudnnOpTensor(cudnnHandle_t handle, const cudnnOpTensorDescriptor_t opTensorDesc, const void *alpha1,
                            const cudnnTensorDescriptor_t aDesc, const void *A, const void *alpha2,
                            const cudnnTensorDescriptor_t bDesc, const void *B, const void *beta,
                            const cudnnTensorDescriptor_t cDesc, void *C);
cudnnStatus_t cudnnCreatePoolingDescriptor(cudnnPoolingDescriptor_t *poolingDesc);
cudnnStatus_t cudnnDestroyPoolingDescriptor(cudnnPoolingDescriptor_t poolingDesc);
cudnnStatus_t cudnnSetPooling2dDescriptor(cudnnPoolingDescriptor_t poolingDesc, cudnnPoolingMode_t mode,
                                          cudnnNanPropagation_t maxpoolingNanOpt, int windowHeight, int windowWidth,
                                          int verticalPadding, int horizontalPadding, int verticalStride,
                                          int horizontalStride);
cudnnStatus_t cudnnGetPooling2dDescriptor(const cudnnPoolingDescriptor_t poolingDesc, cudnnPoolingMode_t *mode,
                                          cudnnNanPropagation_t *maxpoolingNanOpt, int *windowHeight,
                                          int *windowWidth, int *verticalPadding, int *horizontalPadding,
                                          int *verticalStride, int *horizontalStride);
cudnnStatus_t cudnnSetPoolingNdDescriptor(cudnnPoolingDescriptor_t poolingDesc, const cudnnPoolingMode_t mode,
                                          const cudnnNanPropagation_t maxpoolingNanOpt, int nbDims,
                                          const int windowDimA[], const int paddingA[], const int strideA[]);
cudnnStatus_t cudnnGetPoolingNdDescriptor(const cudnnPoolingDescriptor_t poolingDesc, int nbDimsRequested,
                                          cudnnPoolingMode_t *mode, cudnnNanPropagation_t *maxpoolingNanOpt,
                                          int *nbDims, int windowDimA[], int paddingA[], int strideA[]);
cudnnStatus_t cudnnGetPooling2dForwardOutputDim(const cudnnPoolingDescriptor_t poolingDesc,
                                                const cudnnTensorDescriptor_t inputTensorDesc, int *n, int *c,
                                                int *h, int *w);
cudnnStatus_t cudnnGetPoolingNdForwardOutputDim(const cudnnPoolingDescriptor_t poolingDesc,
                                                const cudnnTensorDescriptor_t inputTensorDesc, int nbDims,
                                                int outputTensorDimA[]);
cudnnStatus_t cudnnPoolingForward(cudnnHandle_t handle, const cudnnPoolingDescriptor_t poolingDesc, const void *alpha,
                                  const cudnnTensorDescriptor_t xDesc, const void *x, const void *beta,
                                  const cudnnTensorDescriptor_t yDesc, void *y);
cudnnStatus_t cudnnPoolingBackward(cudnnHandle_t handle, const cudnnPoolingDescriptor_t poolingDesc, const void *alpha,
                                   const cudnnTensorDescriptor_t yDesc, const void *y,
                                   const cudnnTensorDescriptor_t dyDesc, const void *dy,
                                   const cudnnTensorDescriptor_t xDesc, const void *x, const void *beta,
                                   const cudnnTensorDescriptor_t dxDesc, void *dx);
cudnnStatus_t cudnnSoftmaxForward(cudnnHandle_t handle, cudnnSoftmaxAlgorithm_t algo, cudnnSoftmaxMode_t mode,
                                  const void *alpha, const cudnnTensorDescriptor_t xDesc, const void *x,
                                  const void *beta, const cudnnTensorDescriptor_t yDesc, void *y);
cudnnStatus_t cudnnSoftmaxBackward(cudnnHandle_t handle, cudnnSoftmaxAlgorithm_t algo, cudnnSoftmaxMode_t mode,
                                   const void *alpha, const cudnnTensorDescriptor_t yDesc, const void *y,
                                   const cudnnTensorDescriptor_t dyDesc, const void *dy, const void *beta,
                                   const cudnnTensorDescriptor_t dxDesc, void *dx);
cudnnStatus_t cudnnCreateLRNDescriptor(cudnnLRNDescriptor_t *normDesc);
cudnnStatus_t cudnnDestroyLRNDescriptor(cudnnLRNDescriptor_t lrnDesc);
cudnnStatus_t cudnnSetLRNDescriptor(cudnnLRNDescriptor_t normDesc, unsigned lrnN, double lrnAlpha, double lrnBeta,
                                    double lrnK);
cudnnStatus_t cudnnGetLRNDescriptor(cudnnLRNDescriptor_t normDesc, unsigned *lrnN, double *lrnAlpha, double *lrnBeta,
                                    double *lrnK);
cudnnStatus_t cudnnLRNCrossChannelForward(cudnnHandle_t handle, cudnnLRNDescriptor_t normDesc, cudnnLRNMode_t lrnMode,
                                          const void *alpha, const cudnnTensorDescriptor_t xDesc, const void *x,
                                          const void *beta, const cudnnTensorDescriptor_t yDesc, void *y);
cudnnStatus_t cudnnLRNCrossChannelBackward(cudnnHandle_t handle, cudnnLRNDescriptor_t normDesc, cudnnLRNMode_t lrnMode,
                                           const void *alpha, const cudnnTensorDescriptor_t yDesc, const void *y,
                                           const cudnnTensorDescriptor_t dyDesc, const void *dy,
                                           const cudnnTensorDescriptor_t xDesc, const void *x, const void *beta,
                                           const cudnnTensorDescriptor_t dxDesc, void *dx);
cudnnStatus_t cudnnCreateReduceTensorDescriptor(cudnnReduceTensorDescriptor_t *reduceTensorDesc);
cudnnStatus_t cudnnDestroyReduceTensorDescriptor(cudnnReduceTensorDescriptor_t reduceTensorDesc);
cudnnStatus_t cudnnSetReduceTensorDescriptor(cudnnReduceTensorDescriptor_t reduceTensorDesc,
                                             cudnnReduceTensorOp_t reduceTensorOp, cudnnDataType_t reduceTensorCompType,
                                             cudnnNanPropagation_t reduceTensorNanOpt,
                                             cudnnReduceTensorIndices_t reduceTensorIndices,
                                             cudnnIndicesType_t reduceTensorIndicesType);
cudnnStatus_t cudnnGetReduceTensorDescriptor(const cudnnReduceTensorDescriptor_t reduceTensorDesc,
                                             cudnnReduceTensorOp_t *reduceTensorOp,
                                             cudnnDataType_t *reduceTensorCompType,
                                             cudnnNanPropagation_t *reduceTensorNanOpt,
                                             cudnnReduceTensorIndices_t *reduceTensorIndices,
                                             cudnnIndicesType_t *reduceTensorIndicesType);
cudnnStatus_t cudnnGetReductionIndicesSize(cudnnHandle_t handle, const cudnnReduceTensorDescriptor_t reduceTensorDesc,
                                           const cudnnTensorDescriptor_t aDesc, const cudnnTensorDescriptor_t cDesc,
                                           size_t *sizeInBytes);
cudnnStatus_t cudnnGetReductionWorkspaceSize(cudnnHandle_t handle, const cudnnReduceTensorDescriptor_t reduceTensorDesc,
                                             const cudnnTensorDescriptor_t aDesc, const cudnnTensorDescriptor_t cDesc,
                                             size_t *sizeInBytes);
cudnnStatus_t cudnnReduceTensor(cudnnHandle_t handle, const cudnnReduceTensorDescriptor_t reduceTensorDesc, void *indices,
                                size_t indicesSizeInBytes, void *workspace, size_t workspaceSizeInBytes,
                                const void *alpha, const cudnnTensorDescriptor_t aDesc, const void *A,
                                const void *beta, const cudnnTensorDescriptor_t cDesc, void *C);
}
